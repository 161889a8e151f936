"""Schemas per queue on a real redis-server: versions and compatibility, every core push
path checked (push, push_batch, push_encoded, producer pushes, delayed pushes, forward,
the Spark writer's push), a batch refused whole, and a schema set by one bus enforced on
another that had not heard of it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis

from busmq import (
    Bus,
    Compatibility,
    InvalidSchemaError,
    JsonSchema,
    Mode,
    SchemaCompatibilityError,
    SchemaError,
)
from busmq.message import EncodedMessage, PayloadKind
from busmq.schemas import Compiled
from busmq.spark import _core as spark_core
from tests.support.redis_server import RedisServer
from tests.support.waiting import take

ORDER = JsonSchema(
    {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^o-[0-9]+$"},
            "qty": {"type": "integer", "minimum": 1},
            "state": {"enum": ["new", "paid"]},
        },
        "required": ["id", "qty"],
    }
)
GOOD = {"id": "o-1", "qty": 2, "state": "new"}


@pytest.fixture
async def bus(redis_server: RedisServer, make_bus: Callable[..., Any]) -> Bus:
    made: Bus = await make_bus([redis_server.url])
    return made


async def stored(bus: Bus, name: str) -> list[Any]:
    return [m.data async for m in bus.queue(name).browse()]


async def test_versions_are_kept_with_the_queue_and_checked_for_compatibility(bus: Bus) -> None:
    async with bus.queue("orders") as orders:
        assert await orders.schema() is None
        first = await orders.set_schema(ORDER)
        assert (first.version, first.schema) == (1, ORDER)
        assert (await orders.set_schema(ORDER)).version == 1  # the same schema: no new version
        # Adding an optional field where any other field was allowed breaks BACKWARD.
        wider = dict(ORDER.document)
        wider["properties"] = {**ORDER.document["properties"], "note": {"type": "string"}}
        with pytest.raises(SchemaCompatibilityError) as refused:
            await orders.set_schema(JsonSchema(wider))
        assert refused.value.breaks == [
            "field `note` added where the old version allowed any other field"
        ]
        assert isinstance(refused.value, ValueError)
        assert (await orders.schema()) == first  # kept
        # A type change breaks every mode but NONE; with NONE it is version 2.
        changed = dict(ORDER.document)
        changed["properties"] = {**ORDER.document["properties"], "qty": {"type": "string"}}
        with pytest.raises(SchemaCompatibilityError, match="changed type integer -> string"):
            await orders.set_schema(JsonSchema(changed), compatibility="FULL")
        second = await orders.set_schema(JsonSchema(changed), compatibility=Compatibility.NONE)
        assert second.version == 2
        assert [v.version for v in await orders.schema_versions()] == [1, 2]
        await orders.remove_schema()
        assert await orders.schema() is None
        await orders.push({"anything": True})  # not checked any more
        assert [v.version for v in await orders.schema_versions()] == [1, 2]


def test_a_malformed_schema_is_refused_with_where_it_is_wrong() -> None:
    with pytest.raises(InvalidSchemaError, match="at /properties/qty/minimum"):
        JsonSchema({"properties": {"qty": {"minimum": "one"}}})
    with pytest.raises(InvalidSchemaError, match="must be JSON"):
        JsonSchema({"type": {1, 2}})  # type: ignore[dict-item]


async def test_every_core_push_path_stores_what_fits_and_refuses_what_does_not(bus: Bus) -> None:
    async with bus.queue("orders") as orders:
        await orders.set_schema(ORDER)
        await orders.push(GOOD)
        with pytest.raises(SchemaError) as refused:
            await orders.push({"id": "x", "qty": "7"})
        assert isinstance(refused.value, ValueError)
        assert sorted((v.index, v.pointer, v.rule) for v in refused.value.violations) == [
            (0, "/id", "pattern"),
            (0, "/qty", "type"),
        ]
        # A batch is refused whole: nothing of it is stored.
        with pytest.raises(SchemaError) as batch:
            await orders.push_batch([GOOD, GOOD, {"id": "o-3"}, GOOD])
        [violation] = batch.value.violations
        assert (violation.index, violation.pointer, violation.rule) == (2, "", "required")
        with pytest.raises(SchemaError, match="not JSON"):
            await orders.push(b"\xff not json")
        await orders.push_batch([GOOD, (GOOD, {"h": "v"})])
        good = EncodedMessage(b'{"id": "o-9", "qty": 1}', PayloadKind.JSON, b"")
        bad = EncodedMessage(b'{"id": "o-9", "qty": 0}', PayloadKind.JSON, b"")
        with pytest.raises(SchemaError, match="minimum"):
            await orders.push_encoded([good, bad])
        await orders.push_encoded([good])
        producer = await bus.producer("importer")
        with pytest.raises(SchemaError):
            await orders.push({"qty": 1}, producer=producer, sequence=1)
        await orders.push(GOOD, producer=producer, sequence=1)
        with pytest.raises(SchemaError):
            await orders.push({"qty": 1}, delay=0.05)
        await orders.push({**GOOD, "id": "o-2"}, delay=0.05)
        assert len(await stored(bus, "orders")) == 5
        async with orders.consume(Mode.AT_LEAST_ONCE) as consumer:
            got = await take(consumer, 6)
        assert {d.schema_version for d in got} == {1}
        assert got[-1].data["id"] == "o-2"  # the delayed one, version kept while it waited


async def test_a_queue_without_a_schema_stores_no_version(
    bus: Bus, redis_server: RedisServer
) -> None:
    async with bus.queue("plain") as plain:
        await plain.push_batch([b"raw", {"any": "thing"}, ("text", {"h": "1"})])
        client = redis_server.client()
        try:
            entries = await client.xrange(plain.store.keys.stream)
        finally:
            await client.aclose()
        assert all(b"sv" not in fields for _, fields in entries)
        async with plain.consume(Mode.AT_MOST_ONCE) as consumer:
            assert [d.schema_version for d in await take(consumer, 3)] == [None] * 3


async def test_a_schema_set_by_one_bus_is_enforced_on_another(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    one: Bus = await make_bus([redis_server.url])
    other: Bus = await make_bus([redis_server.url])
    async with one.queue("shared") as mine, other.queue("shared") as theirs:
        await theirs.push({"before": "any schema"})  # `other` now believes: no schema
        await mine.set_schema(ORDER)
        with pytest.raises(SchemaError):
            await theirs.push({"before": "any schema"})
        await theirs.push(GOOD)
        # A compatible version 2 (a field dropped where others are allowed): `other`
        # still believes 1, is told 2, checks against 2 and stores under 2.
        relaxed = dict(ORDER.document)
        fields = ORDER.document["properties"]
        relaxed["properties"] = {k: v for k, v in fields.items() if k != "state"}
        await mine.set_schema(JsonSchema(relaxed))
        await theirs.push({**GOOD, "state": "anything now"})
        versions = [m.schema_version async for m in theirs.browse()]
        assert versions == [None, 1, 2]


async def test_forward_checks_the_target_and_leaves_a_refused_delivery_pending(bus: Bus) -> None:
    async with bus.queue("inbound") as inbound, bus.queue("orders") as orders:
        await orders.set_schema(ORDER)
        await inbound.push_batch([GOOD, {"id": "o-2", "qty": 0}])
        async with inbound.consume(Mode.AT_LEAST_ONCE) as consumer:
            first, second = await take(consumer, 2)
            assert await first.forward(orders, first.data) is True
            with pytest.raises(SchemaError, match="minimum"):
                await second.forward(orders, second.data)
            assert (await inbound.info()).pending == 1  # not acked: still the consumer's
        assert [m.schema_version async for m in orders.browse()] == [1]


async def test_the_spark_writers_push_is_checked(bus: Bus, redis_server: RedisServer) -> None:
    async with bus.queue("rows") as rows:
        await rows.set_schema(ORDER)
        client = redis.Redis.from_url(redis_server.url)
        try:
            good = [b'{"id": "o-1", "qty": 1}', b"j", b""]
            bad = [b'{"id": "o-2"}', b"j", b""]
            with pytest.raises(SchemaError, match="message 1 at /: "):
                await asyncio.to_thread(spark_core.push, client, "rows", good + bad, "r1", 60)
            _, duplicate = await asyncio.to_thread(spark_core.push, client, "rows", good, "r2", 60)
        finally:
            client.close()
        assert not duplicate
        assert [m.schema_version async for m in rows.browse()] == [1]


async def test_a_requeued_dead_letter_must_fit_the_current_schema(bus: Bus) -> None:
    async with bus.queue("orders") as orders:
        await orders.push_batch([GOOD, {"id": "o-2"}])  # no schema yet: both stored
        async with orders.consume(Mode.AT_LEAST_ONCE) as consumer:
            for delivery in await take(consumer, 2):
                await delivery.reject("downstream was down")
        await orders.set_schema(ORDER)
        requeued = await orders.requeue_dead()
        assert len(requeued) == 1  # the one that fits; the other stays dead
        back = [m async for m in orders.browse()]
        assert [(m.data, m.schema_version) for m in back] == [(GOOD, 1)]
        (dead,) = [m async for m in orders.dead_letters().browse()]
        # It stays dead for the schema now, saying what does not fit.
        assert dead.data == {"id": "o-2"}
        assert dead.headers["busmq-dead-reason"] == "schema"
        assert dead.headers["busmq-dead-error"].startswith("schema version 1: at /: ")
        assert "required" in dead.headers["busmq-dead-error"]
        assert dead.headers["busmq-dead-queue"] == "orders"  # the rest of its story is kept
        assert "downstream was down" not in dead.headers["busmq-dead-error"]
        assert await orders.requeue_dead() == []
        assert await orders.requeue_dead([dead.id]) == []
        assert [m.data async for m in orders.dead_letters().browse()] == [{"id": "o-2"}]
        await orders.remove_schema()  # without a schema it goes back as it is
        assert len(await orders.requeue_dead()) == 1
        assert [m.data async for m in orders.browse()] == [GOOD, {"id": "o-2"}]


async def test_closing_the_queue_drops_its_versions_and_validators(bus: Bus) -> None:
    orders = bus.queue("short-lived")
    await orders.attach()
    await orders.set_schema(ORDER)
    await orders.push(GOOD)
    token = bus.schemas.current["short-lived"]
    assert token is not None and token.startswith("1:")
    assert bus.schemas.get("short-lived", token) is not None
    await orders.close()
    assert "short-lived" not in bus.schemas.current
    assert bus.schemas.get("short-lived", token) is None
    async with bus.queue("short-lived") as again:  # a new queue of that name: no schema
        assert await again.schema() is None
        await again.push({"anything": "goes"})


async def test_a_queue_made_again_elsewhere_is_not_checked_against_the_old_ones_version(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    """Both queues number their first version 1: a process that compiled the old
    queue's version 1 must not take it for the new queue's."""
    here: Bus = await make_bus([redis_server.url])
    elsewhere: Bus = await make_bus([redis_server.url])
    mine = here.queue("reborn")
    await mine.attach()
    await mine.set_schema(JsonSchema({"type": "object", "required": ["old"]}))
    await mine.push({"old": 1})  # `here` compiled version 1 and believes it current
    theirs = elsewhere.queue("reborn")
    await theirs.close()
    await theirs.attach()
    await theirs.set_schema(JsonSchema({"type": "object", "required": ["new"]}))
    with pytest.raises(SchemaError) as refused:
        await mine.push({"old": 2})  # fits the old version 1, not the new one
    assert refused.value.violations[0].message == '"new" is a required property'
    await mine.push({"new": 1})
    assert [m.data async for m in theirs.browse()] == [{"new": 1}]


def test_a_payload_is_read_as_json_reads_it() -> None:
    """Payloads are parsed by orjson, with json's reading where orjson refuses what json
    (and so a consumer's ``delivery.data``) reads."""
    compiled = Compiled(1, JsonSchema({"type": "object", "required": ["qty"]}))
    assert compiled.violations([b'{"qty": 2}', b'{"qty": NaN}', b'{"qty": Infinity}']) == []
    (bad,) = compiled.violations([b'{"qty": 2'])
    assert (bad.index, bad.rule) == (0, "json") and bad.message.startswith("not JSON")
    (missing,) = compiled.violations([b"{}"])
    assert missing.rule == "required"
