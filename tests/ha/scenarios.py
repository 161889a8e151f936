"""Scenarios run the same way on every Redis engine (a Sentinel shard, a cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

from busmq import Bus, BusError, Mode, Request
from tests.support.waiting import eventually


async def queue_channel_service_and_persistable(bus: Bus) -> None:
    """Replay reads, a channel, a request/reply service and a persistable."""
    async with bus.queue("jobs") as queue:
        assert await queue.push_batch(["a", "b", "c"]) == [1, 2, 3]
        async with queue.consume(Mode.REPLAY, from_id=0, max=2) as reader:
            assert [d.data async for d in reader] == ["a", "b"]
        async with queue.consume(Mode.REPLAY, from_id=2, max=2) as reader:
            assert [d.data async for d in reader] == ["b", "c"]

    server = bus.channel("chat", local="server", remote="client")
    client = bus.channel("chat", local="client", remote="server")
    await server.connect(Mode.AT_LEAST_ONCE)
    await client.connect(Mode.AT_LEAST_ONCE)
    await client.send("hello")
    async for delivery in server:
        assert delivery.data == "hello"
        await delivery.ack()
        break
    await client.end()

    service = bus.service("echo")

    async def echo(request: Request) -> dict[str, object]:
        return {"echo": request.data}

    serving = asyncio.create_task(service.serve(echo))
    try:
        assert await service.request("hi", timeout=5) == {"echo": "hi"}
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    profile = bus.persistable("user:1", {"visits": 0})
    await profile.load()
    profile["visits"] += 1
    await profile.save()
    again = bus.persistable("user:1", {"visits": 0})
    assert await again.load() and again["visits"] == 1


async def ordered_per_key(
    bus: Bus, fault: Callable[[], Awaitable[None]] | None = None
) -> tuple[list[tuple[str, int, int]], int]:
    """An ordered queue, 400 messages over 10 keys, two consumers, with ``fault`` run once
    half of them are handled. Asserts every message handled and, per key, first handlings
    in push order; returns the overlaps seen per key (for the caller to judge) and the
    redeliveries."""
    from tests.core.test_ordering import Overlaps  # the checker the core tests use

    rng = random.Random(39)
    queue = bus.queue("ordered-ha")
    await queue.attach()
    await queue.set_ordering("k")
    keys = [f"key-{i}" for i in range(10)]
    pushed: dict[str, list[int]] = {k: [] for k in keys}
    batch = [rng.choice(keys) for _ in range(400)]
    ids = await queue.push_batch([(k, {"k": k}) for k in batch])
    for message_id, key in zip(ids, batch, strict=True):
        pushed[key].append(message_id)
    seen = Overlaps()
    handled: set[int] = set()
    redelivered = 0

    async def consume() -> None:
        nonlocal redelivered
        async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=10, visibility_timeout=1.0) as c:
            async for delivery in c:
                key = delivery.headers["k"]
                redelivered += delivery.delivery_count > 1
                seen.start(key, delivery.id)
                await asyncio.sleep(0.001)  # a handling time, so that handlings could overlap
                seen.end(key, delivery.id)
                handled.add(delivery.id)
                with contextlib.suppress(BusError):  # lost to the fault: redelivered
                    await delivery.ack()

    tasks = [asyncio.create_task(consume()) for _ in range(2)]
    try:
        if fault is not None:
            await eventually(lambda: len(handled) >= 200, timeout=30, what="half handled")
            await fault()
        await eventually(lambda: len(handled) == 400, timeout=60, what="all handled")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for key, ids in pushed.items():
        assert list(dict.fromkeys(seen.done.get(key, []))) == ids, key
    await queue.close()
    return seen.overlaps, redelivered
