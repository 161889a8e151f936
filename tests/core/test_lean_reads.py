"""Lean reads on real redis-servers: a queue without processing controls is read with a
plain XREADGROUP (no script), and a consumer reading so still obeys a control, a delayed
push or a retry announced after it went lean."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from busmq import Bus, Mode
from busmq.keys import QueueKeys
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually, take


@pytest.fixture
async def one_bus(redis_server: RedisServer, make_bus: Callable[..., Any]) -> Bus:
    # No lease renewal, claim or tick while a test counts scripts: what a consumer learns
    # here it learns from announcements.
    bus: Bus = await make_bus([redis_server.url], lease_seconds=120, block_seconds=60)
    return bus


async def script_calls(server: RedisServer) -> int:
    return await server.command_calls("evalsha")


@pytest.mark.parametrize("mode", [Mode.AT_MOST_ONCE, Mode.AT_LEAST_ONCE])
async def test_a_queue_without_controls_is_read_without_the_read_script(
    one_bus: Bus, redis_server: RedisServer, mode: Mode
) -> None:
    async with one_bus.queue("plain") as queue, queue.consume(mode) as consumer:
        await queue.push("first")
        [first] = await take(consumer, 1)  # the first read is a full one: it says lean
        if mode is Mode.AT_LEAST_ONCE:
            await consumer.ack_upto(first.id)
        before = await script_calls(redis_server)
        for i in range(20):
            await queue.push(i)  # one script call each
            [delivery] = await take(consumer, 1)
            assert delivery.data == i
            if mode is Mode.AT_LEAST_ONCE:
                await consumer.ack_upto(delivery.id)  # one script call each
        per_message = 2 if mode is Mode.AT_LEAST_ONCE else 1
        assert await script_calls(redis_server) - before == 20 * per_message
        # At-most-once reads delete what they read; at-least-once leaves nothing pending.
        await eventually(lambda: _count_is(queue, 0), what="an empty stream")


async def _count_is(queue: Any, expected: int) -> bool:
    return bool(await queue.count() == expected)


async def test_a_consumer_reading_lean_gets_a_delayed_push_when_due(one_bus: Bus) -> None:
    async with one_bus.queue("later") as queue, queue.consume() as consumer:
        await queue.push("now")
        await take(consumer, 1)
        delayed_id = await queue.push("later", delay=0.3)
        loop = asyncio.get_running_loop()
        pushed = loop.time()
        [delivery] = await take(consumer, 1, timeout=5)
        assert (delivery.id, delivery.data) == (delayed_id, "later")
        assert loop.time() - pushed >= 0.29


async def test_a_consumer_reading_lean_stops_at_a_pause_announced_by_an_earlier_version(
    one_bus: Bus, redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    # Earlier versions set the field and published 0 (no id is 0): consumers recheck.
    # The push comes from another bus, as from another process beside such a version: its
    # announcement reaches this consumer after the 0. (A push of the consumer's own
    # process sends the consumer's read with it, maybe before the 0 was read here: a
    # change reaches a consumer after at most the one read it had in flight.)
    producer: Bus = await make_bus([redis_server.url])
    async with one_bus.queue("old-pause") as queue, queue.consume(prefetch=1) as consumer:
        await queue.push("before")
        await take(consumer, 1)
        keys = QueueKeys("old-pause")
        client = redis_server.client()
        try:
            await client.hset(keys.info, "paused", "1")
            await client.publish(keys.notify_channel, "0")
        finally:
            await client.aclose()
        async with producer.queue("old-pause") as other:
            await other.push("during")
        with pytest.raises(TimeoutError):
            await take(consumer, 1, timeout=0.5)
        await queue.resume()
        [delivery] = await take(consumer, 1)
        assert delivery.data == "during"


async def test_a_lean_read_of_a_promoted_message_forgets_its_alias(
    one_bus: Bus, redis_server: RedisServer
) -> None:
    # A delayed message promoted by another consumer's full read while this one reads
    # lean: stored after later ones, under an alias the read must clear.
    async with one_bus.queue("promoted") as queue, queue.consume() as consumer:
        await queue.push("plain")
        await take(consumer, 1)
        keys = QueueKeys("promoted")
        client = redis_server.client()
        try:
            seq = int(await client.hincrby(keys.info, "seq", 1))
            position = f"{seq}-1"
            await client.xadd(
                keys.stream, {"p": b"moved", "k": b"b", "t": b"0", "i": str(seq)}, id=position
            )
            await client.hset(keys.alias, str(seq), position)
            await client.publish(keys.notify_channel, str(seq))
            [delivery] = await take(consumer, 1)
            assert (delivery.id, delivery.message.payload) == (seq, b"moved")
            await eventually(lambda: _no_key(client, keys.alias), what="the alias cleared")
        finally:
            await client.aclose()


async def _no_key(client: Any, key: str) -> bool:
    return not await client.exists(key)
