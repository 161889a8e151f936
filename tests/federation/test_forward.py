"""Forwarding to a federated queue: a stage in DC-B forwards deliveries of a local queue
to a queue in DC-A through the source's outbox and the link; across a cut longer than
the gateway's request-id window, with two buses forwarding side by side (each pushes
the other's entries too), DC-A stores one output per delivery."""

from __future__ import annotations

import json

import pytest

from busmq import Bus, BusError, Mode
from busmq.keys import QueueKeys
from tests.federation.conftest import DatacenterA, MakeB
from tests.support.waiting import eventually

DEDUPE_SECONDS = 0.5
GATEWAY_ENV = {"BUSMQ_DEDUPE_SECONDS": str(DEDUPE_SECONDS)}  # DC-A forgets request ids fast


async def test_forwarding_across_a_long_cut_stores_each_output_once(
    dc_a: DatacenterA, make_b: MakeB
) -> None:
    invoices = dc_a.bus.queue("invoices")
    await invoices.attach(ttl=120)
    b1, b2 = await make_b(), await make_b()
    src1, src2 = b1.queue("orders"), b2.queue("orders")
    await src1.attach(ttl=120)
    await src2.attach(ttl=120)
    await src1.push_batch(list(range(20)))
    remote1, remote2 = b1.federate("invoices", dc_a.url), b2.federate("invoices", dc_a.url)

    async with src1.consume(Mode.AT_LEAST_ONCE, max=4) as stage:
        async for delivery in stage:
            assert await delivery.forward(remote1, {"src": delivery.id})
    assert await remote1.push("marker", request_id="marker-1") == 5

    await dc_a.proxy.cut()
    async with (
        src1.consume(Mode.AT_LEAST_ONCE, max=8, prefetch=1) as one,
        src2.consume(Mode.AT_LEAST_ONCE, max=8, prefetch=1) as two,
    ):
        for _ in range(8):  # the two stages take turns
            for stage, remote in ((one, remote1), (two, remote2)):
                delivery = await anext(stage)
                assert await delivery.forward(remote, {"src": delivery.id})
    assert (await src1.info()).pending == 0
    # Each stage pushed the other's earlier entries too: duplicates wait in the outboxes.
    assert remote1.outbox_depth + remote2.outbox_depth > 16
    dedupe_key = QueueKeys("invoices").dedupe_prefix + "marker-1"

    async def window_over() -> bool:
        return not await dc_a.bus.shards[0].client.exists(dedupe_key)

    await eventually(window_over, timeout=DEDUPE_SECONDS * 20, what="request id forgotten")
    await dc_a.proxy.restore()
    await eventually(
        lambda: remote1.outbox_depth == 0 and remote2.outbox_depth == 0, what="outboxes drained"
    )
    stored = [m.payload async for m in invoices.browse()]
    outputs = [json.loads(p)["src"] for p in stored if p != b"marker"]
    assert sorted(outputs) == list(range(1, 21))
    assert outputs[:4] == [1, 2, 3, 4]


async def test_a_federated_queues_delivery_does_not_forward(dc_a: DatacenterA, dc_b: Bus) -> None:
    local = dc_a.bus.queue("remote-src")
    await local.attach(ttl=120)
    await local.push("m")
    target = dc_b.queue("local-dst")
    await target.attach(ttl=120)
    async with dc_b.federate("remote-src", dc_a.url).consume(Mode.AT_LEAST_ONCE) as consumer:
        delivery = await anext(consumer)
        with pytest.raises(BusError, match="forward"):
            await delivery.forward(target, "x")
        assert await delivery.ack()
