"""Ordering per key on a real redis-server: one delivery per key in flight, in push
order, across consumers; redeliveries first; other keys in parallel; bad input refused."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from busmq import Bus, Mode, OrderingError, RateLimit, UnknownMessageError, inventory, scripts
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually, take


@pytest.fixture
async def one_bus(redis_server: RedisServer, make_bus: Callable[..., Any]) -> Bus:
    bus: Bus = await make_bus([redis_server.url])
    return bus


class Overlaps:
    """Per key: the handler of a message starts only after the handler of every earlier
    message of its key has ended (what ordering promises), checked as handlers run."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.done: dict[str, list[int]] = {}
        self.overlaps: list[tuple[str, int, int]] = []

    def start(self, key: str, n: int) -> None:
        if key in self.running:
            self.overlaps.append((key, self.running[key], n))
        self.running[key] = n

    def end(self, key: str, n: int) -> None:
        if self.running.get(key) == n:
            del self.running[key]
        self.done.setdefault(key, []).append(n)


def without_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load the scripts with the ordering's lock taken out: every message takes its key."""
    original = scripts.script_source

    def mutated(name: str, sharded_publish: bool = False) -> str:
        source = original(name, sharded_publish)
        lock = "    if not holder then return true end"
        assert lock in source or "order_taker" not in source  # the scripts that take keys
        return source.replace(lock, "    if true then return true end")

    monkeypatch.setattr(scripts, "script_source", mutated)


@pytest.mark.parametrize("lock", ["kept", "removed"])
async def test_one_delivery_per_key_in_flight_in_push_order_across_consumers(
    redis_server: RedisServer,
    make_bus: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    lock: str,
) -> None:
    """With the lock removed (a mutation check), the same run must see overlaps."""
    if lock == "removed":
        without_the_lock(monkeypatch)
    one_bus: Bus = await make_bus([redis_server.url])
    keys = [f"k{i}" for i in range(20)]
    async with one_bus.queue("ordered") as queue:
        await queue.set_ordering("customer")
        pushed: dict[str, list[int]] = {k: [] for k in keys}
        items = []
        for n in range(1000):
            key = random.choice(keys)
            pushed[key].append(n)
            items.append(({"n": n}, {"customer": key}))
        await queue.push_batch(items)
        seen = Overlaps()

        async def work(i: int) -> None:
            async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=10) as consumer:
                async for delivery in consumer:
                    key, n = delivery.headers["customer"], delivery.data["n"]
                    seen.start(key, n)
                    # a handling time, so that handlings could overlap
                    await asyncio.sleep(random.random() / 500)
                    seen.end(key, n)
                    await delivery.ack()
                    if sum(map(len, seen.done.values())) == 1000:
                        return

        async with asyncio.timeout(60):
            tasks = [asyncio.create_task(work(i)) for i in range(4)]
            await eventually(lambda: sum(map(len, seen.done.values())) == 1000, timeout=60)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if lock == "removed":
            assert seen.overlaps, "without the lock, handlers of a key overlap"
            return
        assert seen.overlaps == []
        assert seen.done == {k: v for k, v in pushed.items() if v}
        info = await queue.info()
        assert info.ordering == "customer"
        assert info.ordering_state is not None
        assert (info.ordering_state.keys_in_flight, info.ordering_state.waiting) == (0, 0)


async def test_a_nack_and_a_lapsed_visibility_timeout_redeliver_before_later_messages(
    one_bus: Bus,
) -> None:
    async with one_bus.queue("ordered-redelivery") as queue:
        await queue.set_ordering("k")
        await queue.push_batch([(f"a{i}", {"k": "a"}) for i in range(3)] + [("b0", {"k": "b"})])
        async with queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0.3) as consumer:
            first = await take(consumer, 2)
            assert sorted(d.data for d in first) == ["a0", "b0"]  # a1 waits for a0
            a0 = next(d for d in first if d.data == "a0")
            await next(d for d in first if d.data == "b0").ack()
            await a0.nack()
            [again] = await take(consumer, 1)
            assert (again.data, again.delivery_count) == ("a0", 2)
            # Not acked: the visibility timeout lapses, a0 comes back, still before a1.
            [third] = await take(consumer, 1)
            assert (third.data, third.delivery_count) == ("a0", 3)
            await third.ack()
            [a1] = await take(consumer, 1)
            assert (a1.data, a1.delivery_count) == ("a1", 1)
            # a2 waits for a1: what comes next is a1 again, once its timeout lapses.
            [a1] = await take(consumer, 1)
            assert (a1.data, a1.delivery_count) == ("a1", 2)
            await a1.ack()
            [a2] = await take(consumer, 1)
            assert (a2.data, a2.delivery_count) == ("a2", 1)


async def test_messages_without_the_header_never_wait(one_bus: Bus) -> None:
    async with one_bus.queue("ordered-mixed") as queue:
        await queue.set_ordering("k")
        await queue.push_batch([("x1", {"k": "x"}), ("x2", {"k": "x"}), "free1", "free2"])
        async with queue.consume(Mode.AT_LEAST_ONCE) as consumer:
            got = await take(consumer, 3)
            assert [d.data for d in got] == ["x1", "free1", "free2"]
            state = (await queue.info()).ordering_state
            assert state is not None and (state.keys_in_flight, state.waiting) == (1, 1)
            assert state.oldest_waiting_age is not None
            await got[0].ack()
            [x2] = await take(consumer, 1)
            assert x2.data == "x2"


async def test_held_keys_are_a_hash_table_from_the_first_read_and_counted_right(
    redis_server: RedisServer, one_bus: Bus
) -> None:
    """A listpack `held` hash makes every key taken or freed a linear scan (measured at
    2 us per field on a read of 200): the scripts pin it to a hash table, and the counts
    the queue's info and the inventory (CLI, dashboard) give leave the pin out."""
    async with one_bus.queue("ordered-pinned") as queue:
        await queue.set_ordering("k")
        await queue.push_batch([(f"m{i}", {"k": f"key{i % 3}"}) for i in range(6)])
        async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=10) as consumer:
            got = await take(consumer, 3)
            assert sorted(d.headers["k"] for d in got) == ["key0", "key1", "key2"]
            redis = redis_server.client()
            try:
                assert await redis.object("encoding", queue.store.keys.held) == b"hashtable"
            finally:
                await redis.aclose()
            assert await _counts(queue) == (3, 3)
            [stats] = await inventory.read_stats(one_bus.shards[0], [queue.name])
            assert stats.ordered_keys_in_flight == 3
            for delivery in got:
                await delivery.ack()
            again = await take(consumer, 3)
            for delivery in again:
                await delivery.ack()
            assert await _counts(queue) == (0, 0)
            [stats] = await inventory.read_stats(one_bus.shards[0], [queue.name])
            assert stats.ordered_keys_in_flight == 0


async def _counts(queue: Any) -> tuple[int, int]:
    state = (await queue.info()).ordering_state
    assert state is not None
    return state.keys_in_flight, state.waiting


async def test_a_delayed_message_holds_its_keys_place(one_bus: Bus) -> None:
    async with one_bus.queue("ordered-delayed") as queue:
        await queue.set_ordering("k")
        await queue.push("late", headers={"k": "a"}, delay=0.4)
        await queue.push("after", headers={"k": "a"})
        await queue.push("other", headers={"k": "b"})
        got: list[str] = []
        async with queue.consume(Mode.AT_LEAST_ONCE) as consumer, asyncio.timeout(10):
            async for delivery in consumer:
                got.append(delivery.data)
                await delivery.ack()
                if len(got) == 3:
                    break
        assert got == ["other", "late", "after"]


async def test_dead_letters_and_rejects_free_the_key(one_bus: Bus) -> None:
    async with one_bus.queue("ordered-dead") as queue:
        await queue.set_ordering("k")
        await queue.push_batch([("bad", {"k": "a"}), ("good", {"k": "a"})])
        async with queue.consume(Mode.AT_LEAST_ONCE, max_deliveries=2) as consumer:
            [bad] = await take(consumer, 1)
            await bad.nack()
            [bad] = await take(consumer, 1)
            assert bad.delivery_count == 2
            await bad.nack()  # the second failure dead-letters it
            [good] = await take(consumer, 1)
            assert good.data == "good"
            await good.ack()
        assert (await queue.info()).dead_letters == 1


async def test_an_ack_of_a_holder_trimmed_while_pending_frees_its_key_in_a_mixed_batch(
    one_bus: Bus, redis_server: RedisServer
) -> None:
    # The ack's one XACK takes the trimmed holder, and 999 makes the batch mixed: what
    # the XACK took is then told apart by what it left, and the stream no longer has
    # the holder. Its key must come free all the same, or "next" would wait forever.
    async with one_bus.queue("ordered-trimmed") as queue:
        await queue.set_ordering("k")
        await queue.push("holder", headers={"k": "a"})
        async with queue.consume(Mode.AT_LEAST_ONCE) as consumer:
            [holder] = await take(consumer, 1)
            raw = redis_server.client()
            try:
                assert await raw.xdel(queue.store.keys.stream, f"{holder.id}-0") == 1
            finally:
                await raw.aclose()
            await queue.push("next", headers={"k": "a"})
            with pytest.raises(UnknownMessageError) as error:
                await queue.ack(holder.id, 999)
            assert error.value.ids == (999,)
            [after] = await take(consumer, 1, timeout=10)
            assert after.data == "next"
            await after.ack()


async def test_turning_ordering_on_over_a_backlog_keeps_its_order_and_off_frees_it(
    one_bus: Bus,
) -> None:
    async with one_bus.queue("ordered-backlog") as queue:
        await queue.push_batch([(f"m{i}", {"k": "a"}) for i in range(5)])
        await queue.set_ordering("k")
        async with queue.consume(Mode.AT_LEAST_ONCE) as consumer:
            [m0] = await take(consumer, 1)
            assert m0.data == "m0"
            state = (await queue.info()).ordering_state
            assert state is not None and state.waiting == 4
            await queue.set_ordering(None)
            rest = await take(consumer, 4)
            assert [d.data for d in rest] == ["m1", "m2", "m3", "m4"]
            assert (await queue.info()).ordering is None


async def test_bad_input_gets_clear_errors(one_bus: Bus) -> None:
    async with one_bus.queue("ordered-bad") as queue:
        with pytest.raises(ValueError, match="header name"):
            await queue.set_ordering("two words")
        await queue.set_ordering("k")
        with pytest.raises(OrderingError, match="more than an ordering key may be"):
            await queue.push_batch([("ok", {"k": "a"}), ("long", {"k": "x" * 2000})])
        assert await queue.count() == 0  # the batch is refused whole
        with pytest.raises(OrderingError, match="at-least-once"):
            async with queue.consume(Mode.AT_MOST_ONCE):
                pass
    async with one_bus.queue("replayed") as queue:
        async with queue.consume(Mode.REPLAY, from_id=0):
            pass
        with pytest.raises(OrderingError, match="replay"):
            await queue.set_ordering("k")


@pytest.mark.parametrize("unit", ["x", "é", '"'], ids=["ascii", "two-byte-utf8", "escaped-in-json"])
async def test_the_ordering_key_limit_counts_the_keys_own_bytes(one_bus: Bus, unit: str) -> None:
    """The push script decodes headers only when they are longer than a key may be: the
    limit holds at its edge whatever the key's JSON encoding adds."""
    fits = "x" * (1024 % len(unit.encode())) + unit * (1024 // len(unit.encode()))
    assert len(fits.encode()) == 1024
    async with one_bus.queue(f"ordered-limit-{ord(unit)}") as queue:
        await queue.set_ordering("k")
        await queue.push_batch([("fits", {"k": fits})])
        with pytest.raises(OrderingError, match="more than an ordering key may be"):
            await queue.push_batch([("too long", {"k": fits + unit})])
        assert await queue.count() == 1


async def test_forward_keeps_the_order_per_key_into_an_ordered_target(one_bus: Bus) -> None:
    keys = [f"k{i}" for i in range(5)]
    rng = random.Random(39)
    batch = [rng.choice(keys) for _ in range(300)]
    async with one_bus.queue("ordered-source") as source, one_bus.queue("ordered-sink") as sink:
        await source.set_ordering("k")
        await sink.set_ordering("k")
        await source.push_batch([({"n": n}, {"k": k}) for n, k in enumerate(batch)])

        async def stage() -> None:
            async with source.consume(Mode.AT_LEAST_ONCE, prefetch=10) as consumer:
                async for delivery in consumer:
                    # a handling time, so that handlings could overlap
                    await asyncio.sleep(random.random() / 1000)
                    await delivery.forward(sink, delivery.data, headers=dict(delivery.headers))

        stages = [asyncio.create_task(stage()) for _ in range(3)]
        got: dict[str, list[int]] = {}
        async with sink.consume(Mode.AT_LEAST_ONCE, prefetch=50) as consumer:
            async with asyncio.timeout(30):
                async for delivery in consumer:  # acked as it comes: the sink is ordered too
                    got.setdefault(delivery.headers["k"], []).append(delivery.data["n"])
                    await delivery.ack()
                    if sum(map(len, got.values())) == 300:
                        break
        for task in stages:
            task.cancel()
        await asyncio.gather(*stages, return_exceptions=True)
    want: dict[str, list[int]] = {}
    for n, k in enumerate(batch):
        want.setdefault(k, []).append(n)
    assert got == want


async def test_a_per_key_rate_limit_still_applies_to_an_ordered_key(one_bus: Bus) -> None:
    async with one_bus.queue("ordered-paced") as queue:
        await queue.set_ordering("k")
        await queue.set_rate_limit(RateLimit(5, 1.0, key="k"))
        await queue.push_batch([(f"a{i}", {"k": "a"}) for i in range(10)] + [("b0", {"k": "b"})])
        started = time.monotonic()
        got: list[str] = []
        async with queue.consume(Mode.AT_LEAST_ONCE) as consumer, asyncio.timeout(10):
            async for delivery in consumer:
                got.append(delivery.data)
                await delivery.ack()
                if len(got) == 11:
                    break
        elapsed = time.monotonic() - started
    assert [g for g in got if g.startswith("a")] == [f"a{i}" for i in range(10)]
    assert got.index("b0") < got.index("a5")  # b is not held back by a's budget
    assert elapsed >= 0.9  # a's last 5 waited for tokens (5 per second, after a burst of 5)
