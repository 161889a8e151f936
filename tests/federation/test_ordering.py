"""Ordering per key with a consumer in datacenter B through the gateway: one more member
of the same ordered group, across a cut of the link."""

from __future__ import annotations

import asyncio
import contextlib
import random

from busmq import Bus, BusUnavailableError, Mode
from busmq.events import Event
from busmq.keys import CONSUMER_GROUP, QueueKeys
from busmq.message import Delivery
from tests.core.test_ordering import Overlaps
from tests.federation.conftest import DatacenterA
from tests.support.waiting import eventually


async def test_a_federated_consumer_joins_the_ordered_group_across_a_link_cut(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    rng = random.Random(39)
    local = dc_a.bus.queue("fed-ordered")
    await local.attach(ttl=120)
    await local.set_ordering("account")
    keys = [f"acct-{i}" for i in range(20)]
    pushed: dict[str, list[int]] = {k: [] for k in keys}
    for _ in range(4):
        batch = [rng.choice(keys) for _ in range(250)]
        ids = await local.push_batch([({"k": k}, {"account": k}) for k in batch])
        for i, k in zip(ids, batch, strict=True):
            pushed[k].append(i)
    remote = dc_b.federate("fed-ordered", dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach()
    seen = Overlaps()
    by_side = {"A": 0, "B": 0}
    redelivered = 0

    async def handle(side: str, delivery: Delivery) -> None:
        nonlocal redelivered
        key = delivery.headers["account"]
        seen.start(key, delivery.id)
        redelivered += delivery.delivery_count > 1
        await asyncio.sleep(rng.random() / 500)  # a handling time, so that handlings could overlap
        seen.end(key, delivery.id)
        by_side[side] += 1
        # An ack lost to the cut leaves the delivery pending: it comes again.
        with contextlib.suppress(BusUnavailableError):
            await delivery.ack()

    def finished() -> bool:
        return {i for ids in seen.done.values() for i in ids} >= {
            i for ids in pushed.values() for i in ids
        }

    async def consume(side: str, queue: object) -> None:
        # A delivery whose visibility timeout lapses while it waits in the read-ahead
        # comes again to the other side, and the late handling of the first overlaps it
        # (docs/design.md, "Ordering per key"): 1 s lapsed so on a loaded machine.
        consumer = queue.consume(  # type: ignore[attr-defined]
            Mode.AT_LEAST_ONCE, prefetch=10, visibility_timeout=5.0
        )
        async with consumer:
            async for delivery in consumer:
                await handle(side, delivery)
                if finished():
                    return

    async def cut_and_restore() -> None:
        await eventually(lambda: by_side["B"] >= 100, timeout=30, what="B handling")
        await dc_a.proxy.cut()
        await eventually(lambda: by_side["A"] >= 300, timeout=30, what="A going on alone")
        await dc_a.proxy.restore()

    async with asyncio.timeout(90):
        tasks = [
            asyncio.create_task(consume("A", local)),
            asyncio.create_task(consume("B", remote)),
            asyncio.create_task(cut_and_restore()),
        ]
        await eventually(finished, timeout=90, what="every message handled")
        await tasks[2]
        for task in tasks[:2]:
            task.cancel()
        await asyncio.gather(*tasks[:2], return_exceptions=True)
    assert seen.overlaps == []
    for key, ids in pushed.items():  # first handlings in push order, per key
        firsts = list(dict.fromkeys(seen.done.get(key, [])))
        assert firsts == ids, key
    assert by_side["A"] > 0 and by_side["B"] > 0, by_side
    print(f"\nfederated ordered group: {by_side}, {redelivered} redeliveries")


async def test_what_an_ended_stream_sent_and_was_not_handed_out_is_given_back_at_once(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    # An ordered queue's broken stream leaves what it sent leased (its handlers may still
    # run). B drops what it received and had not handed out the moment the stream ends,
    # even while its only handler is busy (nothing of the ended stream is handed out
    # afterwards), and gives it back when it reconnects: those keys do not wait out the
    # 60 s lease.
    local = dc_a.bus.queue("fed-give-back")
    await local.attach(ttl=120)
    await local.set_ordering("account")
    # Three batches of three: one being handed out, one in the hand-over slot, and one
    # the reader waits to queue (so it would not see the stream's end by itself).
    ids = await local.push_batch([({"n": i}, {"account": f"acct-{i}"}) for i in range(9)])
    remote = dc_b.federate("fed-give-back", dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach()
    broke, resumed = asyncio.Event(), asyncio.Event()

    def on_event(event: Event) -> None:
        if event.kind == "error":
            broke.set()
        elif event.kind == "consuming" and event.details.get("resumed"):
            resumed.set()

    remote.events.on(on_event)
    holding, go_on = asyncio.Event(), asyncio.Event()
    handled: list[tuple[int, int, bool]] = []  # id, delivery count, handed out after the cut
    redis = dc_a.redis.client()
    stream = QueueKeys("fed-give-back").stream

    async def all_read_by_the_gateway() -> bool:
        return int((await redis.xpending(stream, CONSUMER_GROUP))["pending"]) == len(ids)

    consumer = remote.consume(Mode.AT_LEAST_ONCE, prefetch=3, visibility_timeout=60.0)

    async def handle_all() -> None:
        async for delivery in consumer:
            handled.append((delivery.id, delivery.delivery_count, broke.is_set()))
            if not holding.is_set():
                holding.set()
                await go_on.wait()
            await delivery.ack()
            if {i for i, _, _ in handled} >= set(ids):
                return

    try:
        async with asyncio.timeout(40), consumer:
            handling = asyncio.create_task(handle_all())
            await holding.wait()
            await eventually(all_read_by_the_gateway, timeout=10, what="all nine read")
            # And received here (what is on the wire at a cut is lost with it: that
            # waits for its lease).
            await eventually(
                lambda: len(consumer.read_ahead_ids()) == len(ids) - 1,
                timeout=10,
                what="the other eight received",
            )
            await dc_a.proxy.cut()
            await broke.wait()
            await dc_a.proxy.restore()
            await resumed.wait()
            go_on.set()
            await handling
    finally:
        await redis.aclose()
    first, *rest = handled
    assert first == (ids[0], 1, False)
    assert {i for i, _, _ in rest} == set(ids[1:])
    assert all(count >= 2 and after for _, count, after in rest), handled
