"""Rate limits and pause hold across consumer processes (``tests/support/bus_worker.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from busmq import Bus, RateLimit
from tests.core.test_faults import WorkerLog, reaped, spawn_worker, worker_settings
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually


async def start_workers(
    server: RedisServer, queue: str, tmp_path: Path, n: int
) -> tuple[list[asyncio.subprocess.Process], list[Path]]:
    logs = [tmp_path / f"worker{i}.log" for i in range(n)]
    workers = []
    for i, log in enumerate(logs):
        args = ["consume", server.url, queue, str(log), "--settings", worker_settings()]
        args += ["--visibility", "30", "--prefetch", "20"]
        workers.append(await spawn_worker(*args, stderr=tmp_path / f"worker{i}.err"))
    return workers, logs


@pytest.mark.slow
async def test_a_rate_limit_of_200_per_second_holds_across_three_processes(
    redis_server: RedisServer, make_bus: Callable[..., Any], tmp_path: Path
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    queue = bus.queue("paced-fleet")
    await queue.attach()
    await queue.set_rate_limit(RateLimit(200, 1.0))
    for _ in range(8):
        await queue.push_batch([b"job"] * 500)  # a backlog far beyond 12 s at 200/s
    async with reaped([]) as workers:
        started, logs = await start_workers(redis_server, queue.name, tmp_path, 3)
        workers += started

        def stamps() -> list[float]:
            return sorted(t for log in logs for t in WorkerLog.read(log).delivered_at)

        await eventually(lambda: len(stamps()) >= 200, what="the first burst delivered")
        begin = stamps()[0] + 1.0  # past the burst of one window (200 tokens)
        await eventually(lambda: stamps()[-1] > begin + 10.5, timeout=20, what="10 s paced")
        window = [t for t in stamps() if begin <= t < begin + 10]
        per_worker = [len(WorkerLog.read(log).delivered) for log in logs]
    rate = len(window) / 10
    print(f"\nrate limit 200/s, 3 processes: {rate:.1f} msg/s over 10 s, per worker {per_worker}")
    assert 190 <= rate <= 210, rate  # within 5 % of the limit, for the three together
    assert all(count > 0 for count in per_worker), per_worker


@pytest.mark.slow
async def test_pause_stops_every_process_within_100_ms_and_resume_restarts_them(
    redis_server: RedisServer, make_bus: Callable[..., Any], tmp_path: Path
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    queue = bus.queue("pausable-fleet")
    await queue.attach()
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            await queue.push(b"tick")
            await asyncio.sleep(0.005)  # the pace of a steady producer

    async with reaped([]) as workers:
        started, logs = await start_workers(redis_server, queue.name, tmp_path, 3)
        workers += started
        producer = asyncio.create_task(produce())
        try:

            def everyone_consuming() -> bool:
                return all(WorkerLog.read(log).delivered for log in logs)

            await eventually(everyone_consuming, timeout=20, what="three workers consuming")
            await queue.pause()
            paused_at = time.time()
            await asyncio.sleep(1.0)  # pushes go on meanwhile
            resumed_at = time.time()
            await queue.resume()

            def everyone_again() -> bool:
                return all(WorkerLog.read(log).delivered_at[-1] > resumed_at for log in logs)

            await eventually(everyone_again, what="every worker consuming after resume")
        finally:
            stop.set()
            await producer

        async def drained() -> bool:  # what was pushed during the pause came after it
            return await queue.count() == 0

        await eventually(drained, what="the pushes made during the pause delivered")
    stamps = [t for log in logs for t in WorkerLog.read(log).delivered_at]
    during = [t for t in stamps if paused_at + 0.1 < t < resumed_at]
    assert during == [], f"{len(during)} deliveries more than 100 ms into the pause"
