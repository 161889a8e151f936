"""Scenarios run the same way on every Redis engine (a Sentinel shard, a cluster)."""

from __future__ import annotations

import asyncio

from busmq import Bus, Mode, Request


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
