"""Idempotent producers through a gateway and across a cut link: a producer's sequence
travels in the push (and in the outbox row), so a push resent after a cut of any
length is stored once, where a request id is only remembered for ``dedupe_seconds``."""

from __future__ import annotations

import pytest

from busmq import Bus, Mode, ProducerFencedError
from busmq.keys import QueueKeys
from tests.federation.conftest import DatacenterA
from tests.support.waiting import eventually

DEDUPE_SECONDS = 0.5
GATEWAY_ENV = {"BUSMQ_DEDUPE_SECONDS": str(DEDUPE_SECONDS)}  # DC-A forgets request ids fast


async def read_all(bus: Bus, name: str, count: int) -> list[bytes]:
    async with bus.queue(name).consume(Mode.AT_MOST_ONCE, max=count) as consumer:
        return [delivery.payload async for delivery in consumer]


async def test_a_cut_longer_than_the_dedupe_window_stores_a_sequenced_push_once(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    local = dc_a.bus.queue("ledger")
    await local.attach(ttl=120)
    remote = dc_b.federate("ledger", dc_a.url)
    assert await remote.push("entry 1", producer="billing", sequence=1) == 1
    assert await remote.push("plain", request_id="plain-1") == 2
    # Both pushes again as if their answers had been lost, now through the outbox,
    # and the link stays down for longer than the gateway remembers request ids.
    await dc_a.proxy.cut()
    assert await remote.push("entry 1", producer="billing", sequence=1) is None
    assert await remote.push("plain", request_id="plain-1") is None
    assert await remote.push("entry 2", producer="billing", sequence=2) is None
    dedupe_key = QueueKeys("ledger").dedupe_prefix + "plain-1"

    async def window_over() -> bool:
        return not await dc_a.bus.shards[0].client.exists(dedupe_key)

    await eventually(window_over, timeout=DEDUPE_SECONDS * 20, what="request id forgotten")
    await dc_a.proxy.restore()
    await eventually(lambda: remote.outbox_depth == 0, what="outbox drained")
    # The request id's retry is stored again (its window passed); the sequenced
    # retry is not, however long the cut.
    assert await read_all(dc_a.bus, "ledger", 4) == [b"entry 1", b"plain", b"plain", b"entry 2"]
    assert await local.last_id() == 4


async def test_a_fenced_producer_is_refused_through_the_gateway(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    old = await dc_b.producer("sync")
    new = await dc_b.producer("sync")
    local = dc_a.bus.queue("mirror")
    await local.attach(ttl=120)
    remote = dc_b.federate("mirror", dc_a.url)
    assert await remote.push(b"old", producer=old, sequence=1) == 1
    assert await remote.push_batch([b"new"], producer=new, sequence=1) == [2]
    assert await remote.push_batch([b"new"], producer=new, sequence=1) == [2]
    with pytest.raises(ProducerFencedError) as refused:
        await remote.push(b"late", producer=old, sequence=2)
    assert refused.value.queue == "mirror"
    assert refused.value.producer == "sync"
    assert (refused.value.epoch, refused.value.current_epoch) == (old.epoch, new.epoch)
    assert await local.count() == 2
