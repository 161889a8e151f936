"""A pipeline stage that forwards (``Delivery.forward``) survives its processes being
killed: three stage processes (``tests/support/bus_worker.py forward``) move 5,000
messages from A to B while one of them is SIGKILLed at a random moment 20 times, and
A's Redis is SIGKILLed once and restarted from its append-only file. B must hold
exactly one output per A message, in A's order for what one consumer took first."""

from __future__ import annotations

import asyncio
import json
import random
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from busmq import Bus, BusUnavailableError, Producer
from tests.core.test_faults import reaped, spawn_worker, worker_settings
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

MESSAGES = 5_000
BATCH = 50
KILLS = 20


async def _feed(queue: Any) -> None:
    """Push the messages in batches at about 500/s, numbered as producer ``feeder``, so
    a batch sent again after an outage (its reply lost) is stored once."""
    feeder = Producer("feeder")
    for number in range(MESSAGES // BATCH):
        batch = [number * BATCH + i for i in range(BATCH)]
        while True:
            try:
                await queue.push_batch(batch, producer=feeder, sequence=number)
                break
            except BusUnavailableError:
                continue  # Redis is restarting: the bus waited out operation_timeout
        await asyncio.sleep(0.1)  # the pace of the flow, while the faults happen


@pytest.mark.slow
@pytest.mark.parametrize("place", ["one server", "two servers"])
async def test_forwarding_through_process_and_redis_kills_stores_each_output_once(
    place: str, make_bus: Callable[..., Any], tmp_path: Path
) -> None:
    src_server = RedisServer(tmp_path / "src")
    await src_server.start()
    dst_server = src_server if place == "one server" else RedisServer(tmp_path / "dst")
    if dst_server is not src_server:
        await dst_server.start()
    rng = random.Random(25)
    try:
        bus: Bus = await make_bus([src_server.url])
        dst_bus: Bus = bus if dst_server is src_server else await make_bus([dst_server.url])
        src = bus.queue("stage-in")
        dst = dst_bus.queue("stage-out")
        await src.attach(ttl=600)
        await dst.attach(ttl=600)
        async with reaped([]) as workers:

            async def spawn(index: int) -> asyncio.subprocess.Process:
                args = ["forward", src_server.url, src.name, str(tmp_path / f"w{index}.log")]
                args += ["--settings", worker_settings(), "--visibility", "1"]
                args += ["--to-url", dst_server.url, "--to", dst.name, "--prefetch", "10"]
                process = await spawn_worker(*args, stderr=tmp_path / f"w{index}.err")
                workers.append(process)
                return process

            running = [await spawn(i) for i in range(3)]
            feeding = asyncio.create_task(_feed(src))
            for kill in range(KILLS):
                await asyncio.sleep(rng.uniform(0.15, 0.5))  # a random moment of the flow
                index = rng.randrange(3)
                running[index].kill()
                await running[index].wait()
                running[index] = await spawn(index)
                if kill == KILLS // 2:
                    src_server.kill()
                    await src_server.wait_exit()
                    await src_server.start()
            await feeding
            await eventually(
                lambda: _settled(src, dst), timeout=90, interval=0.2, what="every message forwarded"
            )
            for process in running:
                process.send_signal(signal.SIGTERM)
            for process in running:
                await process.wait()
        outputs = [json.loads(m.payload) async for m in dst.browse()]
    finally:
        await src_server.stop()
        if dst_server is not src_server:
            await dst_server.stop()
    sources = Counter(o["src"] for o in outputs)
    assert sorted(sources) == list(range(1, MESSAGES + 1))
    assert max(sources.values()) == 1, [s for s, n in sources.items() if n > 1][:10]
    for pid in {o["pid"] for o in outputs}:
        firsts = [o["src"] for o in outputs if o["pid"] == pid and o["first"]]
        assert firsts == sorted(firsts), f"process {pid} stored out of A's order"
    logs = [(tmp_path / f"w{i}.log").read_text().splitlines() for i in range(3)]
    lines = [line.split() for log in logs for line in log]
    redelivered = sum(1 for line in lines if line[0] == "D" and line[2] != "1")
    refused = sum(1 for line in lines if line[0] == "F" and line[3] == "0")
    print(
        f"\n{place}: {MESSAGES} forwarded once each through {KILLS} process kills and a "
        f"Redis kill; {redelivered} redeliveries, {refused} forwards of settled deliveries"
    )


async def _settled(src: Any, dst: Any) -> bool:
    try:
        info = await src.info()
        return info.count == 0 and info.pending == 0 and await dst.count() >= MESSAGES
    except BusUnavailableError:
        return False
