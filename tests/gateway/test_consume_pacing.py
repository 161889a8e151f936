"""The gateway's pacing of a consume stream (``streaming.paced_batches``) on a real
consumer and redis-server: heartbeats after silence, the drain, and nothing lost or
reordered when the wait for the next batch is cut short again and again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from busmq import Bus, Mode
from busmq_gateway.streaming import Beat, paced_batches
from tests.support.redis_server import RedisServer


async def test_a_wait_cut_short_by_heartbeats_loses_and_reorders_nothing(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    draining = asyncio.Event()
    async with bus.queue("paced") as queue, queue.consume(Mode.AT_LEAST_ONCE) as consumer:
        # Heartbeats every 2 ms: the wait is cancelled hundreds of times, also while
        # batches arrive, and each cancelled wait may have taken one from the read-ahead.
        beats = paced_batches(consumer, draining, 0.002)
        received: list[int] = []
        heartbeats = 0

        async def pushes() -> None:
            for burst in range(50):
                await queue.push_batch([burst * 10 + i for i in range(10)])
                await asyncio.sleep(0.003)

        pushing = asyncio.create_task(pushes())
        async for item in beats:
            if item is Beat.HEARTBEAT:
                heartbeats += 1
                continue
            assert isinstance(item, list)
            received += [d.data for d in item]
            await consumer.ack([d.id for d in item])
            if len(received) == 500:
                break
        await pushing
        await beats.aclose()
    assert received == list(range(500))
    assert heartbeats > 10


async def test_the_drain_ends_a_waiting_stream_with_one_draining_beat(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    draining = asyncio.Event()
    async with bus.queue("drained") as queue, queue.consume() as consumer:
        await queue.push("one")
        beats = paced_batches(consumer, draining, 60.0)
        first = await anext(beats)
        assert [d.data for d in first] == ["one"]  # type: ignore[union-attr]
        waiting = asyncio.ensure_future(anext(beats))  # nothing more: waits for a read
        await asyncio.sleep(0)
        draining.set()
        assert await asyncio.wait_for(waiting, 5) is Beat.DRAINING
        assert [item async for item in beats] == []
