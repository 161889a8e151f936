"""A protobuf message type as a queue's schema, on a real redis-server: payloads must
parse as the type, unknown fields refused unless allowed, versions checked for
compatibility field by field (a table per mode), a malformed descriptor set refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from busmq import (
    Bus,
    Compatibility,
    InvalidSchemaError,
    JsonSchema,
    Mode,
    ProtobufSchema,
    SchemaCompatibilityError,
    SchemaError,
    SchemaVersion,
)
from busmq.schema_compat import incompatibilities
from tests.support.redis_server import RedisServer
from tests.support.waiting import take

F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REQUIRED = F.LABEL_OPTIONAL, F.LABEL_REQUIRED


def order_type(*fields: tuple[str, int, int, int], syntax: str = "proto3") -> bytes:
    """A FileDescriptorSet holding ``shop.Order`` with ``fields`` (name, number, type,
    label), serialized."""
    proto = descriptor_pb2.FileDescriptorProto(name="order.proto", package="shop", syntax=syntax)
    message = proto.message_type.add(name="Order")
    for name, number, kind, label in fields:
        message.field.add(name=name, number=number, type=kind, label=label)
    return descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString()


BASE = order_type(("id", 1, F.TYPE_STRING, OPTIONAL), ("qty", 2, F.TYPE_INT32, OPTIONAL))


def order_class(descriptor_set: bytes) -> type[Message]:
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        pool.Add(proto)
    found: type[Message] = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    return found


@pytest.fixture
async def bus(redis_server: RedisServer, make_bus: Callable[..., Any]) -> Bus:
    made: Bus = await make_bus([redis_server.url])
    return made


async def test_payloads_must_parse_as_the_type_and_unknown_fields_are_refused(bus: Bus) -> None:
    async with bus.queue("proto-orders") as orders:
        await orders.set_schema(ProtobufSchema(BASE, "shop.Order"))
        Order = order_class(BASE)
        good = Order(id="o-1", qty=2).SerializeToString()
        await orders.push(good)
        with pytest.raises(SchemaError) as refused:
            await orders.push_batch([good, b"\xff\xff\xff"])
        [violation] = refused.value.violations
        assert (violation.index, violation.rule) == (1, "protobuf")
        extra = good + b"\x18\x05"  # field 3, a varint the type does not define
        with pytest.raises(SchemaError) as unknown:
            await orders.push(extra)
        assert unknown.value.violations[0].rule == "unknown_fields"
        # Allowing unknown fields is a new version; with them allowed, it is stored.
        await orders.set_schema(ProtobufSchema(BASE, "shop.Order", allow_unknown=True))
        await orders.push(extra)
        async with orders.consume(Mode.AT_MOST_ONCE) as consumer:
            got = await take(consumer, 2)
        assert [(Order.FromString(d.payload).id, d.schema_version) for d in got] == [
            ("o-1", 1),
            ("o-1", 2),
        ]
        versions = await orders.schema_versions()
        assert [v.schema for v in versions] == [
            ProtobufSchema(BASE, "shop.Order"),
            ProtobufSchema(BASE, "shop.Order", allow_unknown=True),
        ]


def test_a_descriptor_set_that_does_not_hold_the_type_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="not a FileDescriptorSet"):
        ProtobufSchema(b"\xff\xff", "shop.Order")
    with pytest.raises(InvalidSchemaError, match=r"no message 'shop\.Missing'"):
        ProtobufSchema(BASE, "shop.Missing")


ID = ("id", 1, F.TYPE_STRING, OPTIONAL)
QTY = ("qty", 2, F.TYPE_INT32, OPTIONAL)
CHANGES = {
    # change: (old, new) descriptor sets of shop.Order
    "add a field": (BASE, order_type(ID, QTY, ("note", 3, F.TYPE_STRING, OPTIONAL))),
    "remove a field": (BASE, order_type(ID)),
    "change a field's type": (BASE, order_type(ID, ("qty", 2, F.TYPE_STRING, OPTIONAL))),
    "reuse a field number for another field": (
        BASE,
        order_type(ID, ("price", 2, F.TYPE_DOUBLE, OPTIONAL)),
    ),
    "rename a field": (BASE, order_type(ID, ("quantity", 2, F.TYPE_INT32, OPTIONAL))),
    "add a required field": (
        order_type(ID, syntax="proto2"),
        order_type(ID, ("qty", 2, F.TYPE_INT32, REQUIRED), syntax="proto2"),
    ),
    "remove a required field": (
        order_type(ID, ("qty", 2, F.TYPE_INT32, REQUIRED), syntax="proto2"),
        order_type(ID, syntax="proto2"),
    ),
}

# change -> (BACKWARD, FORWARD, FULL) accepted, unknown fields refused by both versions
EXPECTED = {
    "add a field": (True, False, False),
    "remove a field": (False, True, False),
    "change a field's type": (False, False, False),
    "reuse a field number for another field": (False, False, False),
    "rename a field": (True, True, True),
    "add a required field": (False, False, False),
    "remove a required field": (False, False, False),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_is_accepted_or_refused_per_mode(change: str) -> None:
    old, new = CHANGES[change]
    earlier = [SchemaVersion(1, ProtobufSchema(old, "shop.Order"), 0)]
    modes = (Compatibility.BACKWARD, Compatibility.FORWARD, Compatibility.FULL)
    schema = ProtobufSchema(new, "shop.Order")
    assert tuple(not incompatibilities(m, schema, earlier) for m in modes) == EXPECTED[change]


def test_with_unknown_fields_allowed_adding_and_removing_fields_is_compatible() -> None:
    for old, new in (CHANGES["add a field"], CHANGES["remove a field"]):
        earlier = [SchemaVersion(1, ProtobufSchema(old, "shop.Order", allow_unknown=True), 0)]
        schema = ProtobufSchema(new, "shop.Order", allow_unknown=True)
        assert not incompatibilities(Compatibility.FULL, schema, earlier)


async def test_a_break_is_named_and_a_change_of_kind_is_one(bus: Bus) -> None:
    async with bus.queue("proto-typed") as typed:
        await typed.set_schema(ProtobufSchema(BASE, "shop.Order"))
        changed = ProtobufSchema(CHANGES["change a field's type"][1], "shop.Order")
        with pytest.raises(SchemaCompatibilityError) as refused:
            await typed.set_schema(changed)
        assert refused.value.breaks == ["field `qty` (2) changed type int32 -> string"]
        with pytest.raises(SchemaCompatibilityError, match="kind changed from protobuf to json"):
            await typed.set_schema(JsonSchema({"type": "object"}))
