"""Prompt redelivery: what an at-least-once consumer gives back (its read-ahead when it
closes, a plain nack, ``release_pending``) comes back at the next read of any consumer,
ahead of messages stored after it, not at the next claim of overdue deliveries.

Claims run every ``min(visibility_timeout / 2, block_seconds)``: 60 s here, so only a
prompt give-back arrives within ``take``'s 10 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from busmq import Bus, Mode, controls
from busmq.controls import Settlement
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually, take

MakeBus = Callable[..., Awaitable[Bus]]
SLOW_CLAIMS = {"block_seconds": 60.0}
HELD = 300.0  # visibility timeout: a delivery is never overdue within a test


@pytest.mark.parametrize("prefetch", [1, 5])
@pytest.mark.parametrize("unacked", [0, 10], ids=["all-acked", "10-unacked"])
async def test_closing_gives_back_the_read_ahead_at_once_and_in_order(
    redis_server: RedisServer, make_bus: MakeBus, prefetch: int, unacked: int
) -> None:
    bus = await make_bus([redis_server.url], **SLOW_CLAIMS)
    async with bus.queue("read-ahead") as queue:
        await queue.push_batch(list(range(1, 101)))
        first = queue.consume(Mode.AT_LEAST_ONCE, prefetch=prefetch, visibility_timeout=HELD)
        async with first:
            handed = await take(first, 50 + unacked)
            await first.ack([d.id for d in handed[:50]])
        # Handed out and not acked: still the closed consumer's (a handler may still ack).
        assert (await queue.info()).pending == unacked

        second = queue.consume(Mode.AT_LEAST_ONCE, prefetch=prefetch, visibility_timeout=HELD)
        async with second:
            rest = await take(second, 50 - unacked)
            await second.ack([d.id for d in rest])
        assert [d.data for d in rest] == list(range(51 + unacked, 101))
        counts = [d.delivery_count for d in rest]
        read_ahead = counts.count(2)
        assert read_ahead >= 1, "the first consumer had read ahead when it closed"
        assert counts == [2] * read_ahead + [1] * (len(rest) - read_ahead)

        if unacked:
            held = [d.id for d in handed[50:]]
            await first.ack(held[:1])  # a late ack of a closed consumer still counts
            assert await first.release_pending() == unacked - 1
            async with queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=HELD) as third:
                again = await take(third, unacked - 1)
                await third.ack([d.id for d in again])
            assert [d.id for d in again] == held[1:]
            assert {d.delivery_count for d in again} == {2}
        info = await queue.info()
        assert (info.count, info.pending, info.delayed) == (0, 0, 0)


async def test_a_plain_nack_comes_back_at_the_next_read_ahead_of_newer_messages(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url], **SLOW_CLAIMS)
    async with bus.queue("nacked") as queue:
        await queue.push("first")
        async with queue.consume(
            Mode.AT_LEAST_ONCE, prefetch=1, visibility_timeout=HELD
        ) as consumer:
            (delivery,) = await take(consumer, 1)
            await delivery.nack()
            await queue.push_batch(["second", "third"])
            again = await take(consumer, 3)
            await consumer.ack([d.id for d in again])
        assert [(d.data, d.delivery_count) for d in again] == [
            ("first", 2),
            ("second", 1),
            ("third", 1),
        ]


async def test_a_delivery_given_back_in_one_process_goes_to_a_consumer_in_another(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    giver = await make_bus([redis_server.url], **SLOW_CLAIMS)
    taker = await make_bus([redis_server.url], **SLOW_CLAIMS)
    async with giver.queue("across") as mine, taker.queue("across") as theirs:
        await mine.push_batch(["a", "b"])
        holder = mine.consume(Mode.AT_LEAST_ONCE, prefetch=2, visibility_timeout=HELD)
        async with holder:
            taken = await take(holder, 2)
        # The other process's consumer was idle, waiting for a push: the give-back
        # wakes it (a publication), and its next read takes both, in order.
        async with theirs.consume(Mode.AT_LEAST_ONCE, visibility_timeout=HELD) as other:
            await holder.nack([d.id for d in taken])
            again = await take(other, 2)
            await other.ack([d.id for d in again])
        assert [(d.data, d.delivery_count) for d in again] == [("a", 2), ("b", 2)]


@pytest.mark.parametrize("pauser", ["same-process", "other-process"])
async def test_a_pause_gives_back_the_read_ahead_and_resume_redelivers_it_first(
    redis_server: RedisServer, make_bus: MakeBus, pauser: str
) -> None:
    bus = await make_bus([redis_server.url], **SLOW_CLAIMS)
    other = await make_bus([redis_server.url], **SLOW_CLAIMS) if pauser == "other-process" else bus
    async with bus.queue("paused") as queue, other.queue("paused") as controller:
        await queue.push_batch(list(range(1, 31)))
        consumer = queue.consume(Mode.AT_LEAST_ONCE, prefetch=10, visibility_timeout=HELD)

        async def read_ahead() -> bool:
            return (await queue.info()).pending >= 10

        async def nothing_pending() -> bool:
            return (await queue.info()).pending == 0

        async with consumer:
            first = await take(consumer, 2)
            await consumer.ack([d.id for d in first])
            await eventually(read_ahead, what="a full read-ahead")
            await controller.pause()
            # From another process, the pause arrives as a publication: what the consumer
            # hands out before it arrives is handed out (here: no iteration until then).
            await eventually(lambda: consumer.wake.give_backs > 0, what="the pause announced")
            # Waiting for the next delivery is when the consumer gives its read-ahead back.
            waiting = asyncio.create_task(take(consumer, 28, timeout=30))
            await eventually(nothing_pending, what="the read-ahead given back")
            assert not waiting.done(), "nothing is handed out while paused"
            await controller.resume()
            rest = await waiting
            await consumer.ack([d.id for d in rest])
        assert [d.data for d in rest] == list(range(3, 31))
        counts = [d.delivery_count for d in rest]
        given_back = counts.count(2)
        assert given_back >= 10
        assert counts == [2] * given_back + [1] * (28 - given_back)


async def test_deliveries_given_back_by_separate_calls_come_back_in_stream_order(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    # A closing gateway stream gives back its read-ahead, then (release_pending) what it
    # had handed out, which was read earlier: both come back in stream order.
    bus = await make_bus([redis_server.url], **SLOW_CLAIMS)
    async with bus.queue("two-calls") as queue:
        await queue.push_batch(list(range(1, 21)))
        first = queue.consume(Mode.AT_LEAST_ONCE, prefetch=5, visibility_timeout=HELD)
        async with first:
            handed = await take(first, 5)
        assert await first.release_pending() == 5  # after the close gave back the rest
        async with queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=HELD) as second:
            again = await take(second, 20)
            await second.ack([d.id for d in again])
        assert [d.data for d in again] == list(range(1, 21))
        assert [d.delivery_count for d in again[:5]] == [2] * 5
        assert [d.id for d in handed] == [1, 2, 3, 4, 5]


async def test_a_release_gives_back_only_what_the_consumer_still_holds(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    # A consumer gives back what it holds and never handed out (a closed stream's read-
    # ahead, seen by a client after the break): a delivery that another consumer claimed
    # since, its lease having lapsed, is that one's and stays with it.
    bus = await make_bus([redis_server.url])
    async with bus.queue("release-own") as queue:
        [message_id] = await queue.push_batch(["a"])
        first = queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0.5)
        async with first:
            [held] = await take(first, 1)
        assert held.id == message_id
        # Claims look for deliveries idle past the claimer's own timeout.
        async with queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=2.0) as second:
            [claimed] = await take(second, 1)  # the first's lease lapsed: claimed
            assert (claimed.id, claimed.delivery_count) == (message_id, 2)
            release = Settlement(release=True)
            assert await controls.settle(queue.store, first.name, [message_id], release) == [
                message_id
            ]
            assert (await queue.info()).pending == 1
            assert await controls.settle(queue.store, second.name, [message_id], release) == []
            [again] = await take(second, 1)
            assert (again.id, again.delivery_count) == (message_id, 3)
            await again.ack()
