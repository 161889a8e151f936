"""The three consumption modes: at-most-once, at-least-once and replay."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from busmq import (
    LATEST,
    Bus,
    Delivery,
    Mode,
    ModeConflictError,
    QueueNotFoundError,
    Retention,
    UnknownMessageError,
)
from busmq.consumer import Consumer
from busmq.keys import CONSUMER_GROUP, QueueKeys
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.also_on_uvloop  # the same tests on uvloop's event loop


async def _take(consumer: Consumer, n: int) -> list[Delivery]:
    taken = []
    async for delivery in consumer:
        taken.append(delivery)
        if len(taken) == n:
            break
    return taken


async def test_at_most_once_gives_each_message_to_exactly_one_consumer(bus: Bus) -> None:
    async with bus.queue("amo-shared") as queue:
        await queue.push_batch(list(range(600)))
        seen: list[list[int]] = [[], [], []]

        async def drain(index: int) -> None:
            async with queue.consume(Mode.AT_MOST_ONCE, prefetch=10) as consumer:
                async for delivery in consumer:
                    seen[index].append(delivery.data)
                    if sum(map(len, seen)) == 600:
                        break
                    await asyncio.sleep(0)  # yield, so that the three consumers take turns

        tasks = [asyncio.create_task(drain(i)) for i in range(3)]
        await eventually(lambda: sum(map(len, seen)) == 600, what="all 600 consumed")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        everything = sorted(x for part in seen for x in part)
        assert everything == list(range(600))
        for part in seen:
            assert part == sorted(part)  # each consumer sees its share in order
        assert await queue.count() == 0


async def test_at_most_once_max_consumes_exactly_max_and_leaves_the_rest(bus: Bus) -> None:
    async with bus.queue("amo-max") as queue:
        await queue.push_batch(list(range(10)))
        async with queue.consume(max=4, prefetch=100) as consumer:
            assert [d.data async for d in consumer] == [0, 1, 2, 3]
        assert await queue.count() == 6


async def test_stop_ends_iteration_after_what_was_already_fetched(bus: Bus) -> None:
    async with bus.queue("amo-stop") as queue:
        await queue.push_batch(list(range(50)))
        got = []
        async with queue.consume(prefetch=10) as consumer:
            async for delivery in consumer:
                got.append(delivery.data)
                if len(got) == 5:
                    consumer.stop()
        # Nothing fetched is dropped: the stopped consumer drained its read-ahead.
        remaining = await queue.count()
        assert len(got) + remaining == 50
        assert got == list(range(len(got)))


async def test_close_reports_every_read_ahead_message_it_drops(bus: Bus) -> None:
    async with bus.queue("amo-close") as queue:
        await queue.push_batch(list(range(100)))
        dropped: list[int] = []
        queue.events.on(
            lambda e: dropped.append(e.details["count"]) if e.kind == "dropped" else None
        )
        consumer = queue.consume(Mode.AT_MOST_ONCE, prefetch=10)
        async with consumer:
            first = await consumer.__anext__()

            # The reader is three batches in: the iterator's, one in the buffer, and
            # one it holds until the buffer has room (each deleted as it was read).
            async def three_batches_read() -> bool:
                return await queue.count() == 70

            await eventually(three_batches_read, what="three batches read")
        assert first.data == 0
        # Everything removed from Redis was handed out or reported: nothing vanished.
        assert 1 + sum(dropped) == 100 - await queue.count() == 30


async def test_at_least_once_redelivers_unacked_messages_with_a_delivery_count(bus: Bus) -> None:
    async with bus.queue("alo-redeliver") as queue:
        await queue.push_batch(["a", "b", "c"])
        first = queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0.3)
        async with first:
            taken = await _take(first, 3)
            assert [(d.data, d.delivery_count) for d in taken] == [("a", 1), ("b", 1), ("c", 1)]
            await taken[0].ack()
        # "b" and "c" were handed out and never acked: after the visibility timeout
        # another consumer gets them, marked as redelivered.
        second = queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0.3)
        async with second:
            again = await _take(second, 2)
            assert [(d.data, d.delivery_count) for d in again] == [("b", 2), ("c", 2)]
            assert all(d.redelivered for d in again)
            await queue.ack(*(d.id for d in again))
        assert await queue.count() == 0


async def test_a_stalled_consumer_loses_its_deliveries_and_its_late_settlements_say_so(
    bus: Bus,
) -> None:
    async with bus.queue("alo-stall") as queue:
        await queue.push_batch(list(range(20)))
        stalled = queue.consume(Mode.AT_LEAST_ONCE, prefetch=5, visibility_timeout=0.3)
        live = queue.consume(Mode.AT_LEAST_ONCE, prefetch=5, visibility_timeout=0.3)
        async with stalled, live:
            held = await _take(stalled, 5)  # taken, never acked
            acked: list[int] = []
            async for delivery in live:
                await delivery.ack()
                acked.append(delivery.data)
                if len(acked) == 20:
                    break
            assert sorted(acked) == list(range(20))
            # Already taken over and acked by the live consumer: settled, not an error.
            assert await held[0].ack() is False
            assert await held[1].nack() is False
            assert await held[2].reject("too late") is False
        assert await queue.count() == 0


async def test_a_consumer_does_not_reclaim_what_it_holds_fetched_and_not_handed_out(
    bus: Bus,
) -> None:
    # The handler holds the first delivery past the visibility timeout (as a failover
    # holds an ack up): the lease of every fetched delivery runs out. The one handed
    # out comes again; the four still waiting in the consumer are not handed out twice.
    async with bus.queue("alo-held") as queue:
        await queue.push_batch([1, 2, 3, 4, 5])
        async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=5, visibility_timeout=1.0) as c:
            [first] = await _take(c, 1)
            shard = queue.store.shard
            assert shard is not None

            async def all_claimed() -> bool:
                pending = await shard.client.xpending_range(
                    QueueKeys(queue.name).stream, CONSUMER_GROUP, "-", "+", 10
                )
                return len(pending) == 5 and all(p["times_delivered"] >= 2 for p in pending)

            await eventually(all_claimed, timeout=10, what="the expired leases claimed")
            await queue.push("end")  # read after what the claim handed over
            rest: list[tuple[Any, int]] = []
            async for delivery in c:
                if delivery.data == "end":
                    break
                rest.append((delivery.data, delivery.delivery_count))
                assert await delivery.ack() is True
            assert rest == [(2, 1), (3, 1), (4, 1), (5, 1), (1, 2)]
            assert await first.ack() is False  # its redelivery was acked first
            assert await delivery.ack() is True


async def test_what_another_consumer_claimed_is_not_handed_out_from_the_read_ahead(
    bus: Bus,
) -> None:
    # The first consumer fetched 15 (a batch in hand, one buffered, one waiting for room,
    # so its reader makes no claim) and holds the first past the visibility timeout; a
    # second consumer claims all 15 meanwhile. The first hands out none of its 14 stale
    # copies (a ``lapsed`` event counts them): its next delivery is the next message.
    async with bus.queue("alo-lapsed") as queue:
        lapsed: dict[str, list[int]] = {}
        queue.events.on(
            lambda e: (
                lapsed.setdefault(e.details["consumer"], []).append(e.details["count"])
                if e.kind == "lapsed"
                else None
            )
        )
        await queue.push_batch(list(range(15)))
        first = queue.consume(Mode.AT_LEAST_ONCE, prefetch=5, visibility_timeout=0.5)
        async with first:
            [held] = await _take(first, 1)
            claimed: dict[int, int] = {}
            second = queue.consume(Mode.AT_LEAST_ONCE, prefetch=5, visibility_timeout=0.5)
            async with second:
                async for delivery in second:
                    claimed[delivery.data] = delivery.delivery_count
                    assert await delivery.ack() is True
                    if len(claimed) == 15:
                        break
            # Each came to the second through a claim. On a machine slow enough that the
            # second's own read-ahead outlives 0.5 s, what lapsed there comes once more.
            assert sorted(claimed) == list(range(15))
            assert min(claimed.values()) >= 2, claimed
            if second.name not in lapsed:
                assert claimed == {n: 2 for n in range(15)}
            assert await held.ack() is False  # the second consumer's handling acked it
            await queue.push("next")
            [after] = await _take(first, 1)
            assert after.data == "next"
        # the current batch's 4, then two batches of 5
        assert sum(lapsed[first.name]) == 14, lapsed


async def test_ack_of_unknown_ids_raises_after_acking_the_known_ones(bus: Bus) -> None:
    async with bus.queue("alo-unknown") as queue:
        await queue.push_batch(["a", "b"])
        async with queue.consume(Mode.AT_LEAST_ONCE) as consumer:
            taken = await _take(consumer, 2)
            with pytest.raises(UnknownMessageError) as error:
                await queue.ack(taken[0].id, 999)
            assert error.value.ids == (999,)
            with pytest.raises(UnknownMessageError):
                await queue.ack(taken[0].id)  # acked once already
            assert await queue.ack(taken[1].id) == 1
        assert await queue.count() == 0


async def test_one_ack_of_every_kind_of_id_settles_the_held_and_names_the_rest(
    bus: Bus,
) -> None:
    # One call: pending, waiting for a retry (parked), delayed (stored under a later
    # position), given twice, stored and not delivered yet, never pushed. One XACK takes
    # the pending one; the rest are told apart after it.
    async with bus.queue("alo-mixed-ack") as queue:
        await queue.push_batch(["held", "retried"])
        await queue.push("delayed", delay=0.2)
        async with queue.consume(Mode.AT_LEAST_ONCE, max=3) as consumer:
            held, retried, delayed = await _take(consumer, 3)
            assert (held.data, retried.data, delayed.data) == ("held", "retried", "delayed")
            assert await retried.nack(delay=60) is True
            [waiting] = await queue.push_batch(["not delivered"])
            with pytest.raises(UnknownMessageError) as error:
                await queue.ack(held.id, retried.id, held.id, delayed.id, waiting, 999)
            assert error.value.ids == (held.id, waiting, 999)
        assert await queue.count() == 1
        async with queue.consume(Mode.AT_LEAST_ONCE) as later:
            [left] = await _take(later, 1)
            assert (left.id, left.data, left.delivery_count) == (waiting, "not delivered", 1)
            assert await left.ack() is True


async def test_cumulative_ack_acks_everything_up_to_an_id(bus: Bus) -> None:
    async with bus.queue("alo-upto") as queue:
        await queue.push_batch(list(range(10)))
        async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=10) as consumer:
            taken = await _take(consumer, 10)
            assert await consumer.ack_upto(taken[6].id) == 7
            assert await queue.count() == 3
            assert await consumer.ack_upto(taken[-1].id) == 3
        assert await queue.count() == 0


async def test_nack_hands_a_delivery_back_for_prompt_redelivery(bus: Bus) -> None:
    async with bus.queue("alo-nack") as queue:
        await queue.push("retry me")
        async with queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=60) as consumer:
            first = await _take(consumer, 1)
            await first[0].nack()
            again = await _take(consumer, 1)
            assert (again[0].id, again[0].delivery_count) == (first[0].id, 2)
            await again[0].ack()


async def test_closing_an_at_least_once_consumer_releases_its_read_ahead(bus: Bus) -> None:
    async with bus.queue("alo-release") as queue:
        await queue.push_batch(list(range(10)))
        greedy = queue.consume(Mode.AT_LEAST_ONCE, prefetch=10, visibility_timeout=60)
        async with greedy:
            (only,) = await _take(greedy, 1)
            await only.ack()
        # The nine fetched but never handed out are released, not held for 60 s.
        async with queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=60) as other:
            rest = await _take(other, 9)
            assert sorted(d.data for d in rest) == list(range(1, 10))


async def test_a_backlog_of_released_deliveries_is_claimed_batch_after_batch(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    # Claims run every min(visibility_timeout / 2, block_seconds): 30 s here. A claim
    # that comes back full means more are overdue, so the next one follows at once
    # instead of 30 s later: 100 released deliveries come back 10 by 10 without a pause.
    bus = await make_bus([redis_server.url], block_seconds=30.0)
    async with bus.queue("alo-backlog") as queue:
        await queue.push_batch(list(range(100)))
        greedy = queue.consume(Mode.AT_LEAST_ONCE, prefetch=100, visibility_timeout=3600)
        async with greedy:
            taken = await _take(greedy, 100)
            await greedy.nack([d.id for d in taken])
        async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=10, visibility_timeout=3600) as c:
            again = await asyncio.wait_for(_take(c, 100), timeout=10)
            assert sorted(d.data for d in again) == list(range(100))
            assert {d.delivery_count for d in again} == {2}
            await c.ack([d.id for d in again])
        assert await queue.count() == 0


async def test_run_acks_on_success_and_redelivers_on_failure(bus: Bus) -> None:
    async with bus.queue("alo-run") as queue:
        await queue.push_batch(["ok", "flaky"])
        calls: list[tuple[str, int]] = []
        consumer = queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=60)

        async def handler(delivery: Delivery) -> None:
            calls.append((delivery.data, delivery.delivery_count))
            if delivery.data == "flaky" and delivery.delivery_count == 1:
                raise RuntimeError("transient")
            if len(calls) == 3:
                consumer.stop()

        await consumer.run(handler)
        assert calls == [("ok", 1), ("flaky", 1), ("flaky", 2)]
        assert await queue.count() == 0


async def test_replay_readers_each_see_everything_from_their_start(bus: Bus) -> None:
    async with bus.queue("replay") as queue:
        await queue.push_batch(["a", "b", "c"])
        from_start_1 = queue.consume(Mode.REPLAY, from_id=0)
        from_start_2 = queue.consume(Mode.REPLAY, from_id=0)
        from_two = queue.consume(Mode.REPLAY, from_id=2)
        latest = queue.consume(Mode.REPLAY, from_id=LATEST)
        async with from_start_1, from_start_2, from_two, latest:
            await queue.push_batch(["d", "e"])
            assert [d.data for d in await _take(from_start_1, 5)] == ["a", "b", "c", "d", "e"]
            assert [d.data for d in await _take(from_start_2, 5)] == ["a", "b", "c", "d", "e"]
            assert [d.id for d in await _take(from_two, 4)] == [2, 3, 4, 5]
            assert [d.data for d in await _take(latest, 2)] == ["d", "e"]
        assert await queue.count() == 5  # nothing was removed


async def test_replay_retention_bounds_history_by_length(bus: Bus) -> None:
    queue = bus.queue("retained")
    await queue.attach(retention=Retention(max_length=100))
    await queue.push_batch(list(range(1000)))
    for _ in range(5):
        await queue.push_batch(list(range(50)))
    assert await queue.count() == 100
    async with queue.consume(Mode.REPLAY, from_id=0) as reader:
        history = await _take(reader, 100)
    assert [d.id for d in history] == list(range(1151, 1251))


async def test_replay_retention_bounds_history_by_age(
    shard_urls: list[str], make_bus: Callable[..., Any]
) -> None:
    # Messages age out when a push or a lease renewal trims: with no renewal during the
    # test (a long lease), only the push of "fresh" does, so a slow machine cannot age
    # "fresh" itself out before the reader gets to it.
    bus = await make_bus(shard_urls, lease_seconds=120)
    queue = bus.queue("aged")
    await queue.attach(retention=Retention(max_age=0.3))
    await queue.push_batch(["old-1", "old-2"])
    await asyncio.sleep(0.4)  # let the first messages age past the retention window
    await queue.push("fresh")
    async with queue.consume(Mode.REPLAY, from_id=0) as reader:
        assert [d.data for d in await _take(reader, 1)] == ["fresh"]
    assert await queue.count() == 1


async def test_destructive_and_replay_consumers_cannot_be_mixed(bus: Bus) -> None:
    async with bus.queue("mixed") as queue:
        async with queue.consume(Mode.AT_LEAST_ONCE):
            pass
        with pytest.raises(ModeConflictError) as conflict:
            async with queue.consume(Mode.REPLAY, from_id=0):
                pass
        assert (conflict.value.current, conflict.value.requested) == ("destructive", "replay")
        # at-most-once and at-least-once share the destructive family
        async with queue.consume(Mode.AT_MOST_ONCE):
            pass
    async with bus.queue("mixed-2") as other:
        async with other.consume(Mode.REPLAY):
            pass
        with pytest.raises(ModeConflictError):
            async with other.consume(Mode.AT_MOST_ONCE):
                pass


async def test_consumer_events_are_emitted(bus: Bus) -> None:
    queue = bus.queue("evented")
    events = queue.events.subscribe()
    await queue.attach()
    async with queue.consume(Mode.AT_LEAST_ONCE):
        pass
    await queue.detach()
    kinds = []
    async for event in events:
        kinds.append(event.kind)
        if event.kind == "detached":
            break
    assert kinds == ["attached", "consuming", "stopped", "detached"]


def test_consumer_options_are_validated(bus: Bus) -> None:
    queue = bus.queue("options")
    with pytest.raises(ValueError):
        queue.consume(max=0)
    with pytest.raises(ValueError):
        queue.consume(prefetch=0)
    with pytest.raises(ValueError):
        queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0)


async def test_consumers_end_with_queue_not_found_when_the_queue_is_closed(bus: Bus) -> None:
    async with bus.queue("vanishing") as queue:
        amo = queue.consume(Mode.AT_MOST_ONCE)
        replay_queue = bus.queue("vanishing-replay")
        await replay_queue.attach()
        replay = replay_queue.consume(Mode.REPLAY)
        await amo.start()
        await replay.start()
        await bus.queue("vanishing").close()
        await bus.queue("vanishing-replay").close()
        for consumer in (amo, replay):
            with pytest.raises(QueueNotFoundError):
                async for _ in consumer:
                    pass
            await consumer.close()
