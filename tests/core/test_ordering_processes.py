"""Ordering per key across consumer processes killed at random and a Redis restart
(``tests/support/bus_worker.py consume --order-key``)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from busmq import Bus
from tests.core.test_faults import complete_lines, reaped, spawn_worker, worker_settings
from tests.support.heavy import cpu_heavy
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually


@dataclass
class Run:
    """One handling of a delivery in a worker: from start to end (or the worker's death)."""

    id: int
    count: int
    key: str
    start: float
    end: float | None = None


@dataclass
class OrderedLog:
    runs: list[Run] = field(default_factory=list)
    handled: set[int] = field(default_factory=set)
    """Ids whose handling ran to its end (a kill may land between the ack and its log
    line: the queue's emptiness at the end shows every ack landed)."""

    @classmethod
    def read(cls, path: Path, died_at: float | None) -> OrderedLog:
        log = cls()
        open_runs: dict[int, Run] = {}
        for kind, *rest in complete_lines(path):
            if kind == "S":
                run = Run(int(rest[0]), int(rest[1]), rest[2], float(rest[3]))
                open_runs[run.id] = run
                log.runs.append(run)
            elif kind == "E":
                open_runs.pop(int(rest[0])).end = float(rest[1])
                log.handled.add(int(rest[0]))
        for run in open_runs.values():  # handling cut short by the kill
            run.end = died_at
        return log


def overlaps(runs: list[Run]) -> list[tuple[Run, Run]]:
    """Per key, runs whose handling overlapped an earlier-started run of the same key."""
    found = []
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(run.key, []).append(run)
    for key_runs in by_key.values():
        key_runs.sort(key=lambda r: r.start)
        latest: Run | None = None
        for run in key_runs:
            if latest is not None and (latest.end is None or run.start < latest.end):
                found.append((latest, run))
            if latest is None or latest.end is None or (run.end or 0) >= latest.end:
                latest = run
    return found


@cpu_heavy
@pytest.mark.slow
async def test_ordering_holds_through_20_consumer_kills_and_a_redis_restart(
    redis_server: RedisServer, make_bus: Callable[..., Any], tmp_path: Path
) -> None:
    rng = random.Random(39)
    bus: Bus = await make_bus([redis_server.url])
    queue = bus.queue("ordered-fleet")
    await queue.attach()
    await queue.set_ordering("account")
    keys = [f"acct-{i}" for i in range(200)]
    key_of: dict[int, str] = {}
    for _ in range(20):
        batch = [rng.choice(keys) for _ in range(500)]
        ids = await queue.push_batch([({"v": k}, {"account": k}) for k in batch])
        key_of.update(zip(ids, batch, strict=True))
    assert len(key_of) == 10_000

    logs: list[tuple[Path, list[float]]] = []  # each worker's log and its death time

    async def start_worker() -> asyncio.subprocess.Process:
        path = tmp_path / f"worker{len(logs)}.log"
        logs.append((path, []))
        args = ["consume", redis_server.url, queue.name, str(path)]
        args += ["--settings", worker_settings(), "--visibility", "1.0", "--prefetch", "10"]
        args += ["--delay", "0.001", "--order-key", "account"]
        return await spawn_worker(*args, stderr=tmp_path / f"worker{len(logs) - 1}.err")

    def read_all() -> list[OrderedLog]:
        return [OrderedLog.read(p, died[0] if died else None) for p, died in logs]

    def handled() -> set[int]:
        return set().union(*(log.handled for log in read_all()))

    async with reaped([]) as workers:
        live = [await start_worker() for _ in range(3)]
        workers += live
        for kill in range(20):
            target = min(len(handled()) + 150, 10_000)
            await eventually(lambda t=target: len(handled()) >= t, timeout=30)
            victim = rng.randrange(3)
            live[victim].kill()
            logs[workers.index(live[victim])][1].append(time.time())
            await live[victim].wait()
            live[victim] = await start_worker()
            workers.append(live[victim])
            if kill == 10:  # Redis dies too, and comes back from its AOF
                redis_server.kill()
                await redis_server.wait_exit()
                await redis_server.start()
        await eventually(lambda: len(handled()) == 10_000, timeout=120, what="all handled")

        async def empty() -> bool:
            return await queue.count() == 0

        await eventually(empty, what="every message acked")
        for process in live:
            process.terminate()
        await asyncio.gather(*(p.wait() for p in live))

    runs = [run for log in read_all() for run in log.runs]
    assert handled() == set(key_of)  # nothing lost
    assert all(run.key == key_of[run.id] for run in runs)
    assert overlaps(runs) == []
    first_starts: dict[int, float] = {}
    for run in runs:
        first_starts[run.id] = min(first_starts.get(run.id, run.start), run.start)
    for key in keys:
        ids = [i for i in key_of if key_of[i] == key]
        assert sorted(ids, key=lambda i: first_starts[i]) == sorted(ids), key
    handlings = Counter(run.id for run in runs)
    again = sum(n - 1 for n in handlings.values())
    redelivered = sum(1 for run in runs if run.count > 1)
    print(
        f"\n10,000 ordered messages, 200 keys, 20 kills, 1 Redis restart: {len(runs)} "
        f"handlings ({again} handled again), {redelivered} redeliveries, {len(logs)} workers"
    )
