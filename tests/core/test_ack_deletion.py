"""An ack removes from the stream exactly the entries it settled.

``ack.lua`` trims what lies below the oldest unsettled entry with one ``XTRIM MINID``
and deletes the rest with ``XDEL``. The floor is the lowest of: the first pending entry,
the first parked one (a retry, a given-back delivery, an entry waiting for its key), and
the entry after the group's last delivered one (those after it were never delivered).
Each test leaves one of these as the only thing that keeps the trim from going too far;
with any of them left out of the floor, a test here fails. The acks here settle 19 or 20
entries at a time: an ack of fewer than 16 (``TRIM_FROM``) only deletes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from busmq import Bus, Mode, Queue
from tests.support.redis_server import RedisServer
from tests.support.waiting import take

MakeBus = Callable[..., Awaitable[Bus]]
SLOW_CLAIMS = {"block_seconds": 60.0}
HELD = 300.0  # visibility timeout: nothing is claimed again within a test


async def stream_ids(redis_server: RedisServer, queue: Queue) -> set[int]:
    admin = redis_server.client()
    try:
        entries = await admin.xrange(queue.store.keys.stream)
    finally:
        await admin.aclose()
    return {int(sid.split(b"-")[0]) for sid, _ in entries}


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_acks_out_of_order_remove_what_they_settle_and_keep_the_rest(
    redis_server: RedisServer, make_bus: MakeBus, ordered: bool
) -> None:
    bus = await make_bus([redis_server.url], **SLOW_CLAIMS)
    async with bus.queue("ack-deletion") as queue:
        if ordered:
            await queue.set_ordering("key")
        # Twenty keys, six messages each: in the ordered queue, a key's later messages
        # wait (parked) while an earlier one is out.
        pushed = await queue.push_batch([(i, {"key": f"k{i % 20}"}) for i in range(120)])
        everything = set(pushed)
        acked: set[int] = set()
        consumer = queue.consume(Mode.AT_LEAST_ONCE, prefetch=20, visibility_timeout=HELD)
        async with consumer:
            first = await take(consumer, 20)
            retried = first[4]
            await retried.nack(delay=HELD)  # parked for the rest of the test
            # Ordered, every later message waits behind one of the first twenty.
            second = [] if ordered else await take(consumer, 20)

            # Acked while the first twenty are still unsettled: nothing below them goes.
            await consumer.ack([d.id for d in second])
            acked |= {d.id for d in second}
            assert await stream_ids(redis_server, queue) == everything - acked

            # The first twenty but the one parked: it stays, with all after it not acked.
            await consumer.ack([d.id for d in first if d is not retried])
            acked |= {d.id for d in first if d is not retried}
            assert await stream_ids(redis_server, queue) == everything - acked

            # One by one: ordered, a key's next message comes only after an ack.
            for _ in range(120 - len(acked) - (6 if ordered else 1)):
                (delivery,) = await take(consumer, 1)
                await consumer.ack([delivery.id])
                acked.add(delivery.id)
        remaining = everything - acked
        assert retried.id in remaining
        if ordered:  # the parked retry's key holds its five later messages back
            assert len(remaining) == 6
        else:
            assert remaining == {retried.id}
        assert await stream_ids(redis_server, queue) == remaining
        assert (await queue.info()).count == len(remaining)


async def test_an_ack_with_nothing_else_unsettled_keeps_what_was_never_delivered(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url], **SLOW_CLAIMS)
    async with bus.queue("ack-undelivered") as queue:
        pushed = await queue.push_batch(list(range(30)))
        admin = redis_server.client()
        try:  # twenty delivered, nothing else pending or parked, ten never delivered
            await admin.xreadgroup("busmq", "reader", {queue.store.keys.stream: ">"}, count=20)
        finally:
            await admin.aclose()
        assert await queue.ack(*pushed[:20]) == 20
        assert await stream_ids(redis_server, queue) == set(pushed[20:])
        async with queue.consume(Mode.AT_LEAST_ONCE, visibility_timeout=HELD) as consumer:
            rest = await take(consumer, 10)
        assert [d.id for d in rest] == pushed[20:]
