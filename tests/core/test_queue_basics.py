"""Queue contract: ids, payload kinds, headers, counts, metadata, flush and close."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from busmq import (
    Bus,
    InvalidMessageError,
    InvalidNameError,
    MessageTooLargeError,
    Mode,
    PayloadKind,
    QueueFullError,
    QueueNotFoundError,
)
from busmq.keys import QueueKeys


async def test_ten_thousand_batched_messages_arrive_in_order_with_increasing_ids(bus: Bus) -> None:
    async with bus.queue("ordered") as queue:
        pushed: list[int] = []
        for start in range(0, 10_000, 500):
            pushed += await queue.push_batch([f"m{i}" for i in range(start, start + 500)])
        assert pushed == list(range(1, 10_001))
        received = []
        async with queue.consume(Mode.AT_MOST_ONCE, max=10_000, prefetch=250) as consumer:
            async for delivery in consumer:
                received.append((delivery.id, delivery.data))
        assert [i for i, _ in received] == pushed
        assert [d for _, d in received] == [f"m{i}" for i in range(10_000)]
        assert await queue.count() == 0


async def test_payload_kinds_and_headers_round_trip(bus: Bus) -> None:
    values: list[Any] = [b"\x00\xffraw", "text \u00e9", {"a": [1, 2.5, None, True]}, 42, None]
    async with bus.queue("kinds") as queue:
        first = await queue.push(values[0], headers={"trace": "abc", "type": "bytes"})
        await queue.push_batch(values[1:])
        async with queue.consume(max=len(values)) as consumer:
            got = [d async for d in consumer]
    assert [d.data for d in got] == values
    assert got[0].id == first
    assert dict(got[0].headers) == {"trace": "abc", "type": "bytes"}
    assert got[1].headers == {}
    assert all(d.message.timestamp_ms > 0 for d in got)


async def test_entries_of_plain_bytes_carry_no_kind_and_every_shape_decodes(
    bus: Bus, shard_urls: list[str]
) -> None:
    """A batch of plain bytes goes to Redis as payloads alone and is stored without a
    kind field; a batch that turns mixed part way, and entries written with an explicit
    bytes kind (the shape stored before), decode the same."""
    async with bus.queue("shapes") as queue:
        await queue.push_batch([b"a", b"b"])
        await queue.push_batch([b"c", "d", (b"e", {"h": "1"}), {"f": 1}])
        stream = QueueKeys("shapes").stream
        clients = [aioredis.from_url(url) for url in shard_urls]
        try:
            (holder,) = [c for c in clients if await c.exists(stream)]
            stored = {int(eid.split(b"-")[0]): f for eid, f in await holder.xrange(stream)}
            await holder.xadd(stream, {"p": b"g", "k": "b", "t": "1"}, id="7-0")
            await holder.hset(QueueKeys("shapes").info, "seq", 7)
        finally:
            for client in clients:
                await client.aclose()
        assert set(stored[1]) == set(stored[3]) == {b"p", b"t"}
        assert stored[4][b"k"] == b"s" and stored[6][b"k"] == b"j"
        assert set(stored[5]) == {b"p", b"t", b"h"}
        async with queue.consume(max=7) as consumer:
            got = [d async for d in consumer]
    assert [d.id for d in got] == list(range(1, 8))
    assert [d.data for d in got] == [b"a", b"b", b"c", "d", b"e", {"f": 1}, b"g"]
    assert [d.message.kind for d in got].count(PayloadKind.BYTES) == 5
    assert dict(got[4].headers) == {"h": "1"}
    assert got[6].message.timestamp_ms == 1


async def test_ids_keep_increasing_after_flush_and_count_reflects_backlog(bus: Bus) -> None:
    async with bus.queue("flushing") as queue:
        await queue.push_batch(["a", "b", "c"])
        assert await queue.count() == 3
        await queue.flush()
        assert await queue.count() == 0
        assert await queue.push("d") == 4
        assert await queue.last_id() == 4


async def test_pushed_and_consumed_counters_are_per_client(bus: Bus) -> None:
    async with bus.queue("counters") as queue:
        await queue.push_batch(["a", "b", "c"])
        async with queue.consume(max=2) as consumer:
            _ = [d async for d in consumer]
        assert (queue.pushed, queue.consumed) == (3, 2)
        other = bus.queue("counters")
        async with other:
            assert (other.pushed, other.consumed) == (0, 0)


async def test_metadata_is_shared_and_expires_with_the_queue(bus: Bus) -> None:
    async with bus.queue("meta") as queue:
        await queue.set_metadata({"owner": "billing", "schema": "v2"})
        reader = bus.queue("meta")
        assert await reader.metadata() == {"owner": "billing", "schema": "v2"}
        ttl = await queue.ttl()
        assert ttl is not None and ttl > 0


async def test_close_destroys_the_queue_for_everyone(bus: Bus) -> None:
    owner = bus.queue("doomed")
    other = bus.queue("doomed")
    await owner.attach()
    await other.attach()
    await owner.push("x")
    events = other.events.subscribe()
    await owner.close()
    assert not await other.exists()
    assert await other.renew() is False
    kinds = []
    async for event in events:
        kinds.append(event.kind)
        if event.kind == "closed":
            break
    assert "closed" in kinds
    assert not other.attached


async def test_push_to_a_closed_queue_is_refused(bus: Bus) -> None:
    queue = bus.queue("gone")
    await queue.attach()
    await bus.queue("gone").close()
    with pytest.raises(QueueNotFoundError):
        await queue.push("late")


async def test_max_backlog_refuses_pushes_and_keeps_what_was_stored(bus: Bus) -> None:
    queue = bus.queue("bounded")
    await queue.attach(max_backlog=3)
    await queue.push_batch(["a", "b"])
    with pytest.raises(QueueFullError):
        await queue.push_batch(["c", "d"])
    assert await queue.count() == 2
    assert await queue.push("c") == 3
    async with queue.consume(max=3) as consumer:
        assert [d.data async for d in consumer] == ["a", "b", "c"]


async def test_request_id_makes_a_retried_push_idempotent(bus: Bus) -> None:
    async with bus.queue("idempotent") as queue:
        first = await queue.push_batch(["a", "b"], request_id="req-1")
        again = await queue.push_batch(["a", "b"], request_id="req-1")
        assert first == again == [1, 2]
        assert await queue.count() == 2
        assert queue.pushed == 2


@pytest.mark.parametrize(
    "name", ["", "a" * 201, "has space", "brace{tag}", "-leading", "unicode\u00e9", "x\n"]
)
def test_invalid_queue_names_are_refused(bus: Bus, name: str) -> None:
    with pytest.raises(InvalidNameError):
        bus.queue(name)


@pytest.mark.parametrize("name", ["orders", "a", "eu-west.orders:v2", "team@svc/jobs_1"])
def test_valid_queue_names_are_accepted(bus: Bus, name: str) -> None:
    assert bus.queue(name).name == name


async def test_bad_payloads_are_refused_and_nothing_accepted_is_lost(
    shard_urls: list[str], make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus(shard_urls, max_message_bytes=1024)
    async with bus.queue("bad-input") as queue:
        await queue.push("kept")
        with pytest.raises(InvalidMessageError):
            await queue.push({"not json": {1, 2}})  # type: ignore[dict-item]
        with pytest.raises(InvalidMessageError):
            await queue.push(float("nan"))
        with pytest.raises(MessageTooLargeError) as too_large:
            await queue.push(b"x" * 1025)
        assert too_large.value.limit == 1024
        with pytest.raises(InvalidMessageError):
            await queue.push("x", headers={"n": 1})  # type: ignore[dict-item]
        with pytest.raises(InvalidMessageError):
            await queue.push_batch(["fine", object()])  # type: ignore[list-item]
        assert await queue.count() == 1
        async with queue.consume(max=1) as consumer:
            assert [d.data async for d in consumer] == ["kept"]


async def test_operations_on_a_queue_that_does_not_exist_say_so(bus: Bus) -> None:
    queue = bus.queue("never-attached")
    with pytest.raises(QueueNotFoundError):
        await queue.push("x")
    with pytest.raises(QueueNotFoundError):
        async with queue.consume():
            pass
    with pytest.raises(QueueNotFoundError):
        await queue.flush()
    with pytest.raises(QueueNotFoundError):
        await queue.set_metadata({"a": "b"})
    assert not await queue.exists()
    assert await queue.ttl() is None


async def test_an_unattached_handle_pushes_and_consumes_on_an_existing_queue(bus: Bus) -> None:
    async with bus.queue("shared-handle"):
        producer = bus.queue("shared-handle")
        assert await producer.push("from a handle") == 1
        async with producer.consume(max=1) as consumer:
            assert [d.data async for d in consumer] == ["from a handle"]


async def test_overlapping_detaches_release_the_attachment_once(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from busmq import Event, Mode

    queue = bus.queue("detached-twice")
    await queue.attach()
    consumer = queue.consume(Mode.AT_LEAST_ONCE)
    await consumer.start()
    release, inside = asyncio.Event(), asyncio.Event()
    close = consumer.close

    async def held_close() -> None:
        inside.set()
        await release.wait()  # the first detach is held inside its await
        await close()

    monkeypatch.setattr(consumer, "close", held_close)
    events: list[Event] = []
    queue.events.on(events.append)
    first = asyncio.create_task(queue.detach())
    await inside.wait()
    second = asyncio.create_task(queue.detach())
    await asyncio.sleep(0)  # the second detach reaches its wait on the first
    assert not second.done()
    release.set()
    await asyncio.gather(first, second)
    assert [e.kind for e in events].count("detached") == 1
    assert not queue.attached and queue not in bus.attached
    assert await queue.ttl() is not None  # the attachment was released, the queue remains
    await queue.detach()  # a third, after the fact: nothing to do
