"""A federated consumer's read-ahead lapses when the gateway's read of it does, not a
visibility timeout after it arrived: the batches that waited in the gateway's read-ahead
and in flow-control buffers on the way have less of their lease left than that."""

from __future__ import annotations

import asyncio
import time

from busmq import Bus, Mode
from busmq.keys import CONSUMER_GROUP, QueueKeys
from tests.federation.conftest import DatacenterA

VISIBILITY = 2.0
HANDLING = 0.8


async def test_a_federated_consumer_hands_out_nothing_whose_lease_ran_out_at_the_gateway(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    # One message a batch, each handled in 0.8 s under a 2 s lease: the gateway reads
    # (and sends) all five at once, so the fourth's lease runs out at 2 s while it still
    # waits here; it reached this process at 0.8 s, so counted from its arrival it would
    # be handed out at 2.4 s, claimable by any consumer. At each hand-out the delivery's
    # idle time in Redis (since it was delivered or claimed) must be under the lease.
    local = dc_a.bus.queue("lease-ahead")
    await local.attach(ttl=120)
    await local.push_batch([str(i) for i in range(1, 6)])
    remote = dc_b.federate("lease-ahead", dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach()
    lapsed: list[int] = []
    remote.events.on(lambda e: lapsed.append(e.details["count"]) if e.kind == "lapsed" else None)
    redis = dc_a.redis.client()
    stream = QueueKeys("lease-ahead").stream
    idle_at_hand_out: list[tuple[int, int, float]] = []  # id, delivery count, idle (ms)
    handled: set[int] = set()
    acked_then_redelivered: list[int] = []
    try:
        consumer = remote.consume(Mode.AT_LEAST_ONCE, prefetch=1, visibility_timeout=VISIBILITY)
        async with asyncio.timeout(60), consumer:
            async for delivery in consumer:
                asked = time.monotonic()
                entry = f"{delivery.id}-0"
                found = await redis.xpending_range(stream, CONSUMER_GROUP, entry, entry, 1)
                if not found and delivery.id in handled:
                    # Its handling here outlasted the lease (a loaded machine), so the
                    # gateway claimed it and sent it again before this process acked it:
                    # an at-least-once redelivery of what is acked now, not a hand-out of
                    # a lapsed lease.
                    acked_then_redelivered.append(delivery.id)
                    continue
                [pending] = found
                # Redis measured the idle time between the hand-out and its reply.
                idle = pending["time_since_delivered"] - (time.monotonic() - asked) * 1000
                idle_at_hand_out.append((delivery.id, delivery.delivery_count, idle))
                await asyncio.sleep(HANDLING)
                await delivery.ack()
                handled.add(delivery.id)
                if handled == {1, 2, 3, 4, 5}:
                    break
    finally:
        await redis.aclose()
    late = [(i, n, round(idle)) for i, n, idle in idle_at_hand_out if idle >= VISIBILITY * 1000]
    assert late == [], (
        f"handed out after their lease ran out: {late} "
        f"(acked, then sent again: {acked_then_redelivered})"
    )
    assert lapsed, "the read-ahead never lapsed: the test did not hold it past the lease"
