"""Federated pushes and streams across network cuts and a gateway crash."""

from __future__ import annotations

import asyncio
import itertools
import signal

import redis.asyncio as aioredis

from busmq import Bus, BusUnavailableError, Delivery, Mode
from busmq.federation import LinkState
from busmq.keys import CONSUMER_GROUP, QueueKeys
from tests.federation.conftest import DatacenterA
from tests.support.waiting import eventually

TOTAL = 20_000
BATCH = 100


async def test_pushes_through_two_cuts_arrive_exactly_once_and_in_order(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    local = dc_a.bus.queue("orders")
    await local.attach(ttl=120)
    remote = dc_b.federate("orders", dc_a.url)
    assert await remote.link.wait_usable(10)
    received: list[int] = []

    async def consume_in_a() -> None:
        async with local.consume(Mode.AT_MOST_ONCE, prefetch=500) as consumer:
            async for delivery in consumer:
                received.append(int(delivery.payload))
                if len(received) == TOTAL:
                    return

    consumer = asyncio.create_task(consume_in_a())
    steps = {50: "cut", 70: "restore", 100: "drained", 130: "cut", 150: "restore"}
    queued = direct = 0
    for batch in range(TOTAL // BATCH):
        step = steps.get(batch)
        if step == "cut":
            await dc_a.proxy.cut()
        elif step == "restore":
            assert remote.outbox_depth > 0  # what was pushed during the cut waits on disk
            await dc_a.proxy.restore()
        elif step == "drained":
            # Until the outbox has drained, pushes queue behind it (order); then they
            # go direct again.
            await eventually(lambda: remote.outbox_depth == 0, what="outbox drained")
        first = batch * BATCH
        ids = await remote.push_batch([b"%d" % i for i in range(first, first + BATCH)])
        if ids is None:
            queued += 1
        else:
            direct += 1
    assert queued >= 40 and direct >= 80, (queued, direct)

    await eventually(lambda: len(received) >= TOTAL, timeout=30, what="all messages in A")
    await consumer
    assert received == list(range(TOTAL))  # every message once, in push order
    assert await local.last_id() == TOTAL  # and stored once: retried pushes were deduped
    # Rows are deleted after their round of forwarding, a moment after A stored them.
    await eventually(lambda: remote.outbox_depth == 0, what="outbox empty")
    assert remote.state is LinkState.READY
    assert remote.pushed == TOTAL


async def settle(delivery: Delivery) -> None:
    """Ack until the outcome is known, as an at-least-once application must: an ack
    that failed with the gateway may still have been applied."""
    while True:
        try:
            await delivery.ack()  # False: acked already, by the ack that "failed" or a copy
            return
        except BusUnavailableError:
            await asyncio.sleep(0.1)  # the gateway is down; try again


async def test_at_least_once_consumer_survives_a_gateway_kill_and_loses_nothing(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    local = dc_a.bus.queue("jobs")
    await local.attach(ttl=120)
    await local.push_batch([str(i) for i in range(300)])
    remote = dc_b.federate("jobs", dc_a.url)
    await remote.attach()
    attach_events: list[dict[str, object]] = []
    remote.events.on(lambda e: attach_events.append(e.details) if e.kind == "attached" else None)
    acked: set[int] = set()
    highest_count: dict[int, int] = {}

    async def kill_and_restart_gateway() -> None:
        await eventually(lambda: len(acked) >= 100, what="100 acks before the kill")
        dc_a.gateway.signal(signal.SIGKILL)
        await dc_a.gateway.wait()
        await dc_a.gateway.start()  # same port, new process, no memory of the streams

    killer = asyncio.create_task(kill_and_restart_gateway())
    consumer = remote.consume(Mode.AT_LEAST_ONCE, prefetch=20, visibility_timeout=1.0)
    async with consumer:
        async for delivery in consumer:
            count = highest_count.get(delivery.id, 0)
            highest_count[delivery.id] = max(count, delivery.delivery_count)
            await settle(delivery)
            acked.add(delivery.id)
            if len(acked) == 300:
                break
    await killer
    assert acked == set(range(1, 301))  # nothing lost
    redelivered = [i for i, count in highest_count.items() if count > 1]
    assert redelivered, "deliveries in flight at the kill come again with a higher count"
    assert consumer.reconnects >= 1
    assert await local.count() == 0
    # The attachment id is signed, not remembered: the new gateway process renews it,
    # and the one attachment stays one (no re-attach).
    assert await remote.renew()
    assert remote.attached and attach_events == []
    leases = local.store.keys.leases
    assert await local.store.run(lambda c: c.zcard(leases), idempotent=True) == 2  # ours too


async def test_replay_consumer_resumes_after_a_cut_without_duplicates_or_gaps(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    local = dc_a.bus.queue("history")
    await local.attach(ttl=120)
    for start in range(0, 1500, 100):
        await local.push_batch([str(i) for i in range(start, start + 100)])
    remote = dc_b.federate("history", dc_a.url)
    ids: list[int] = []
    cut_done = asyncio.Event()

    async def cut_mid_stream() -> None:
        await eventually(lambda: len(ids) >= 500, what="500 replayed before the cut")
        await dc_a.proxy.cut()
        await eventually(lambda: remote.state is LinkState.DISCONNECTED, what="link down")
        for start in range(1500, 3000, 100):  # more history while B is cut off
            await local.push_batch([str(i) for i in range(start, start + 100)])
        await dc_a.proxy.restore()
        cut_done.set()

    cutter = asyncio.create_task(cut_mid_stream())
    consumer = remote.consume(Mode.REPLAY, from_id=1, prefetch=50)
    async with consumer:
        async for delivery in consumer:
            ids.append(delivery.id)
            assert delivery.payload == b"%d" % (delivery.id - 1)
            if len(ids) == 3000:
                break
    await cutter
    assert cut_done.is_set()
    assert ids == list(range(1, 3001))
    assert consumer.reconnects >= 1


async def test_at_most_once_consumer_across_a_cut_loses_at_most_what_the_broken_stream_held(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    """Three waves around a cut: before it (in flight when it happens), during it, and
    after the consumer resumed. Nothing comes twice, ids only increase, and the only
    messages lost are the last ones the broken stream had taken from Redis and not yet
    delivered (read back from the consumer group's last-delivered id)."""
    prefetch, wave = 20, 2000
    total = 3 * wave
    local = dc_a.bus.queue("events")
    await local.attach(ttl=120)
    remote = dc_b.federate("events", dc_a.url)
    assert await remote.link.wait_usable(10)
    redis = aioredis.from_url(dc_a.redis.url)
    keys = QueueKeys("events")
    received: list[int] = []
    consumer = remote.consume(Mode.AT_MOST_ONCE, prefetch=prefetch)

    async def consume_in_b() -> None:
        async with consumer:
            async for delivery in consumer:
                assert delivery.payload == b"%d" % delivery.id
                received.append(delivery.id)
                if delivery.id == total:
                    return

    async def push_wave(first: int) -> None:
        for start in range(first, first + wave, 100):
            await local.push_batch([b"%d" % i for i in range(start, start + 100)])

    async def stream_gone() -> bool:
        # The gateway saw the reset: its reader unsubscribed from the queue's wake-ups
        # and has not touched the stream since.
        [(_, subscribers)] = await redis.pubsub_numsub(keys.notify_channel)
        readers = await redis.xinfo_consumers(keys.stream, CONSUMER_GROUP)
        return subscribers == 0 and all(r["idle"] >= 200 for r in readers)

    reader = asyncio.create_task(consume_in_b())
    try:
        await push_wave(1)
        await eventually(lambda: len(received) >= 500, what="B consuming the first wave")
        await dc_a.proxy.cut()
        await eventually(stream_gone, what="the gateway closed the broken stream")
        group = (await redis.xinfo_groups(keys.stream))[0]
        taken = int(group["last-delivered-id"].split(b"-")[0])  # read by the broken stream
        assert taken < wave, "the cut came while the first wave was flowing"
        await push_wave(wave + 1)  # during the cut: waits in Redis
        await dc_a.proxy.restore()
        await eventually(lambda: consumer.reconnects >= 1, what="the stream resumed")
        await push_wave(2 * wave + 1)  # after the resume
        await eventually(
            lambda: bool(received) and received[-1] == total, timeout=30, what="all in B"
        )
        await reader
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await redis.aclose()

    assert all(a < b for a, b in itertools.pairwise(received))  # no duplicate, in order
    assert set(range(taken + 1, total + 1)) <= set(received)  # all the broken stream left
    lost = sorted(set(range(1, total + 1)) - set(received))
    # Lost: only the tail of what the broken stream took (in the gateway's buffers or
    # on the wire), never a message B had received (its buffer is handed out).
    assert lost == list(range(taken - len(lost) + 1, taken + 1))
    assert await local.count() == 0


async def test_leaving_a_federated_queue_after_a_gateway_restart_does_not_fail(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.queue("restarted"), dc_a.url)
    # Not renewed (a renewal would re-attach): the detach below carries the attachment
    # id the restarted gateway never saw.
    await remote.attach(auto_renew=False)
    await remote.push("before")
    dc_a.gateway.signal(signal.SIGKILL)
    await dc_a.gateway.wait()
    await dc_a.gateway.start()  # knows nothing of the attachment
    await remote.push("after")  # the link comes back
    async with remote.consume(max=2) as consumer:
        got = [d.data async for d in consumer]
    assert got == ["before", "after"]
    # Leaving: the new gateway may answer ATTACHMENT_NOT_FOUND, which must not raise.
    await remote.detach()
    assert not remote.attached
