"""Reads nudged by a push of the same process, on real redis-servers: an idle consumer's
read goes out with the push on the hot-path connection instead of a round trip later,
when the push's publication comes back, and the publication of what that read took
wakes no one again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from busmq import Bus, Mode
from busmq.mux import RespProtocol
from busmq.notifier import COVER_SECONDS, Notifier, WakeUp, mark_recheck
from tests.support.redis_server import RedisServer
from tests.support.waiting import take


@pytest.fixture
async def one_bus(redis_server: RedisServer, make_bus: Callable[..., Any]) -> Bus:
    # No tick, lease renewal or claim while a test counts reads: every read here is one a
    # nudge or a publication asked for.
    bus: Bus = await make_bus([redis_server.url], lease_seconds=120, block_seconds=60)
    return bus


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """What each hot-path connection of this process writes, one item a write."""
    seen: list[bytes] = []
    flush = RespProtocol._flush

    def spy(self: RespProtocol) -> None:
        seen.append(b"".join(self._out))
        flush(self)

    monkeypatch.setattr(RespProtocol, "_flush", spy)
    yield seen


async def reads(server: RedisServer) -> int:
    return await server.command_calls("xreadgroup")


@pytest.mark.parametrize("mode", [Mode.AT_MOST_ONCE, Mode.AT_LEAST_ONCE])
async def test_an_idle_consumer_reads_in_the_same_write_as_a_push_of_its_process(
    one_bus: Bus, redis_server: RedisServer, writes: list[bytes], mode: Mode
) -> None:
    async with one_bus.queue("nudged") as queue, queue.consume(mode) as consumer:
        await queue.push("first")
        [first] = await take(consumer, 1)  # the first read is a full one: it says lean
        if mode is Mode.AT_LEAST_ONCE:
            await consumer.ack_upto(first.id)
        before = await reads(redis_server)
        writes.clear()
        for i in range(20):
            await queue.push(i)
            [delivery] = await take(consumer, 1)
            assert delivery.data == i
            if mode is Mode.AT_LEAST_ONCE:
                await consumer.ack_upto(delivery.id)
        with_push = [w for w in writes if b"EVALSHA" in w and b"XREADGROUP" in w]
        assert len(with_push) == 20, [w[:60] for w in writes]
        # One read a message: the publication of what the nudged read took is no news.
        assert await reads(redis_server) - before == 20


async def test_a_consumer_reading_with_the_script_is_nudged_and_covered_too(
    one_bus: Bus, redis_server: RedisServer, writes: list[bytes]
) -> None:
    # An ordered queue's consumer always reads with read.lua: the nudge sends that read
    # behind the push, and the script's last position covers the push's publication.
    read_sha = one_bus.scripts.source("read")[0].encode()
    async with one_bus.queue("nudged-full") as queue:
        await queue.set_ordering("customer")
        async with queue.consume(Mode.AT_LEAST_ONCE) as consumer:
            await queue.push("first", headers={"customer": "a"})
            [first] = await take(consumer, 1)
            await first.ack()
            before = await reads(redis_server)
            writes.clear()
            for i in range(20):
                await queue.push(i, headers={"customer": f"k{i % 3}"})
                [delivery] = await take(consumer, 1)
                assert delivery.data == i
                await delivery.ack()
            with_push = [w for w in writes if w.count(b"EVALSHA") >= 2 and read_sha in w]
            assert len(with_push) == 20, [w[:60] for w in writes]
            assert await reads(redis_server) - before == 20


async def test_competing_consumers_of_one_process_read_no_more_than_without_nudges(
    one_bus: Bus, redis_server: RedisServer
) -> None:
    # Without nudges the publication wakes both: two reads a message. The nudge wakes
    # one, whose read takes the message; the publication then wakes only the other.
    async with (
        one_bus.queue("competing") as queue,
        queue.consume(Mode.AT_MOST_ONCE) as one,
        queue.consume(Mode.AT_MOST_ONCE) as two,
    ):
        got: asyncio.Queue[Any] = asyncio.Queue()

        async def forward(consumer: Any) -> None:
            async for delivery in consumer:
                got.put_nowait(delivery)

        tasks = [asyncio.create_task(forward(c)) for c in (one, two)]
        try:
            await queue.push("first")
            await asyncio.wait_for(got.get(), 10)
            before = await reads(redis_server)
            for i in range(20):
                await queue.push(i)
                delivery = await asyncio.wait_for(got.get(), 10)
                assert delivery.data == i
            assert await reads(redis_server) - before <= 2 * 20
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_consumer_of_another_process_is_woken_by_the_publication(
    one_bus: Bus, redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    other: Bus = await make_bus([redis_server.url], lease_seconds=120, block_seconds=60)
    async with one_bus.queue("elsewhere") as queue, other.queue("elsewhere").consume() as far:
        await queue.push("first")
        await take(far, 1)
        for i in range(5):
            await queue.push(i)  # no consumer of this bus: nothing to nudge
            [delivery] = await take(far, 1, timeout=5)
            assert delivery.data == i


# -- the wake-up's rules, alone --------------------------------------------------------


async def test_a_publication_of_what_the_last_read_received_wakes_no_one() -> None:
    wake = WakeUp()
    wake.cover(10)
    wake.publication(10)
    assert not wake.is_set()
    wake.publication(11)
    assert wake.is_set() and wake.published == 11


async def test_a_publication_after_the_cover_lapsed_wakes_the_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A queue destroyed and created anew numbers its messages from 1 again.
    wake = WakeUp()
    wake.cover(10)
    later = time.monotonic() + COVER_SECONDS + 0.1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    wake.publication(1)
    assert wake.is_set()


async def test_a_wake_up_is_stale_only_if_every_cause_was_a_covered_publication() -> None:
    wake = WakeUp()
    wake.clear()
    wake.publication(7)  # arrived before the read's reply was handled
    wake.cover(7)
    assert wake.stale()
    wake.publication(8)
    assert not wake.stale()  # a message the read did not take
    wake.clear()
    wake.set()  # a tick, a control, a give-back or a nudge
    assert not wake.stale()
    wake.clear()
    assert not wake.stale()  # not set at all


async def test_a_recheck_forgets_what_was_covered() -> None:
    # After a reconnect or a failover the ids may have gone back: every publication wakes.
    wake = WakeUp()
    wake.cover(10)
    mark_recheck({wake})
    wake.clear()
    wake.publication(5)
    assert wake.is_set()


async def test_a_nudge_wakes_one_waiting_consumer_reading_lean() -> None:
    notifier = Notifier.__new__(Notifier)  # its waiters alone: no connection is made
    channel = b"busmq:{q}:n"
    busy, lean, other = WakeUp(), WakeUp(), WakeUp()
    lean.nudgeable = other.nudgeable = True
    notifier._waiters = {channel: {busy, lean, other}}
    notifier.nudge(channel)
    assert not busy.is_set()
    assert [lean.is_set(), other.is_set()].count(True) == 1
    notifier.nudge(channel)
    assert lean.is_set() and other.is_set()
    notifier.nudge(b"busmq:{unwatched}:n")  # no consumer here: nothing happens
