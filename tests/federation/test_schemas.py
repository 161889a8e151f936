"""Schemas per queue from datacenter B: a push that does not fit the remote queue's
schema is refused before it reaches the link or the outbox; a push that waited in the
outbox while the schema changed is refused on arrival and kept as an outbox dead letter,
with the reason and an event."""

from __future__ import annotations

from typing import Any

import pytest

from busmq import Bus, JsonSchema, SchemaError
from tests.federation.conftest import DatacenterA
from tests.support.waiting import eventually

ORDER = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "qty": {"type": "integer"}},
    "required": ["id"],
}


async def test_a_push_that_does_not_fit_is_refused_before_the_outbox(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    local = dc_a.bus.queue("fed-checked")
    await local.attach(ttl=120)
    await local.set_schema(JsonSchema(ORDER))
    remote = dc_b.federate("fed-checked", dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach()
    with pytest.raises(SchemaError) as refused:
        await remote.push({"qty": 1})
    assert [(v.index, v.rule) for v in refused.value.violations] == [(0, "required")]
    assert await remote.push({"id": "a", "qty": 1}) is not None  # stored through the link

    await dc_a.proxy.cut()
    with pytest.raises(SchemaError):
        await remote.push_batch([{"id": "b"}, {"id": "c", "qty": "2"}])
    assert remote.outbox_depth == 0  # nothing of the refused batch waits
    assert await remote.push({"id": "d", "qty": 4}) is None  # fits: kept in the outbox
    assert remote.outbox_depth == 1
    await dc_a.proxy.restore()
    await eventually(lambda: remote.outbox_depth == 0, what="the outbox drained")
    assert [(m.data["id"], m.schema_version) async for m in local.browse()] == [
        ("a", 1),
        ("d", 1),
    ]


async def test_a_push_kept_while_the_schema_changed_becomes_an_outbox_dead_letter(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    manager = dc_b.federation
    assert manager is not None
    local = dc_a.bus.queue("fed-changing")
    await local.attach(ttl=120)
    await local.set_schema(JsonSchema(ORDER))
    remote = dc_b.federate("fed-changing", dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach()
    dead_events: list[dict[str, Any]] = []
    remote.events.on(
        lambda e: dead_events.append(dict(e.details)) if e.details.get("dead_letter") else None
    )
    await dc_a.proxy.cut()
    assert await remote.push({"id": "a"}, request_id="fits-v1") is None  # fits version 1
    stricter = {**ORDER, "required": ["id", "qty"]}
    await local.set_schema(JsonSchema(stricter), compatibility="NONE")  # while it waits
    await dc_a.proxy.restore()

    async def one_dead() -> bool:
        return len(await manager.dead_letters()) == 1

    await eventually(one_dead, what="the push refused on arrival")
    [letter] = await manager.dead_letters()
    assert letter.row.request_id == "fits-v1" and "qty" in letter.error
    assert [e["queue"] for e in dead_events] == ["fed-changing"]
    assert [m async for m in local.browse()] == []
    # B still knows version 1: the gateway refuses, and B learns version 2 from that ...
    with pytest.raises(SchemaError):
        await remote.push({"id": "b"})
    # ... so that with the link cut, a push that does not fit never enters the outbox.
    await dc_a.proxy.cut()
    with pytest.raises(SchemaError) as refused:
        await remote.push({"id": "c"})
    assert refused.value.version == 2
    assert remote.outbox_depth == 0
