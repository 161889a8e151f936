"""Processing controls through a federated queue: a federated consumer's nack with a
delay, max deliveries and reject behave as local ones; delayed pushes keep their due
time, in the outbox too."""

from __future__ import annotations

import asyncio
import time

from busmq import Bus, Mode, RetryPolicy
from busmq.message import Delivery
from tests.federation.conftest import DatacenterA
from tests.support.waiting import eventually


async def first_of(consumer: object) -> Delivery:
    async with asyncio.timeout(10):
        async for delivery in consumer:  # type: ignore[attr-defined]
            return delivery  # type: ignore[no-any-return]
    raise AssertionError("the consumer ended")


async def test_dead_letters_retries_and_requeue_through_a_federated_queue(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.queue("fed-poison"), dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach()
    await remote.push_batch([{"n": 1, "poison": True}, {"n": 2}, {"n": 3, "bad": True}])
    counts: list[int] = []
    done: list[int] = []
    policy = RetryPolicy(initial=0.1, factor=1, jitter=0)
    consumer = remote.consume(Mode.AT_LEAST_ONCE, max_deliveries=2, retry_policy=policy)
    async with consumer:
        async with asyncio.timeout(10):
            async for delivery in consumer:
                if delivery.data.get("poison"):
                    counts.append(delivery.delivery_count)
                    nacked = time.monotonic()
                    await delivery.nack(error="boom")
                    if delivery.delivery_count == 2:
                        break
                elif delivery.data.get("bad"):
                    await delivery.reject("unreadable")
                else:
                    await delivery.ack()
                    done.append(delivery.id)
    assert counts == [1, 2] and done == [2]

    local = dc_a.bus.queue("fed-poison")
    dead = local.dead_letters()
    await eventually(lambda: dead.count(), what="two dead letters")  # type: ignore[arg-type,return-value]
    assert (await local.info()).dead_letters == 2
    async with dead, dead.consume(Mode.REPLAY, from_id=0, max=2) as reader:
        letters = [d async for d in reader]
    reasons = {d.headers["busmq-dead-id"]: d.headers["busmq-dead-reason"] for d in letters}
    assert reasons == {"1": "max-deliveries", "3": "rejected"}
    assert letters[0].headers["busmq-dead-error"] in ("boom", "unreadable")
    assert time.monotonic() - nacked < 5

    assert await remote.requeue_dead() == [4, 5]
    assert (await local.info()).dead_letters == 0


async def test_a_federated_nack_delay_and_delayed_push_come_when_due(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.queue("fed-delayed"), dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach()
    pushed = time.monotonic()
    delayed_id = await remote.push("later", delay=0.5)
    assert delayed_id == 1
    async with remote.consume(Mode.AT_LEAST_ONCE) as consumer:
        delivery = await first_of(consumer)
        assert delivery.id == 1 and time.monotonic() - pushed >= 0.49
        nacked = time.monotonic()
        await delivery.nack(delay=0.4)
        again = await first_of(consumer)
        assert (again.id, again.delivery_count) == (1, 2)
        assert time.monotonic() - nacked >= 0.39
        await again.ack()


async def test_a_delayed_push_kept_in_the_outbox_keeps_its_due_time(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.queue("fed-outbox-delay"), dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach()
    await dc_a.proxy.cut()
    pushed = time.monotonic()
    assert await remote.push("due in 2 s", delay=2.0) is None  # kept in the outbox
    await asyncio.sleep(1.0)
    await dc_a.proxy.restore()
    local = dc_a.bus.queue("fed-outbox-delay")
    async with local.consume(Mode.AT_LEAST_ONCE) as consumer:
        delivery = await first_of(consumer)
        arrived = time.monotonic() - pushed
        await delivery.ack()
    # Due 2 s after the push, not 2 s after the outbox forwarded it (about 1 s later).
    assert delivery.data == "due in 2 s"
    assert 1.98 <= arrived <= 2.7, arrived
