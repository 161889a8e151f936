"""Schemas per queue through the gateway: the schema RPCs, every push RPC refusing what
does not fit with INVALID_ARGUMENT, ErrorInfo reason SCHEMA and BadRequest field
violations (also for a grpcurl request), deliveries showing their schema version."""

from __future__ import annotations

import json

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import types_pb2
from tests.gateway.conftest import AUTH, SECRETS, GatewayUnderTest, error_info
from tests.gateway.test_auth_and_tools import _run, _tool
from tests.gateway.test_queue_service import attach, collect

JSON = types_pb2.PAYLOAD_KIND_JSON
ORDER = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
    "required": ["id", "qty"],
}


def order(**fields: object) -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=json.dumps(fields).encode(), kind=JSON)


def violations(error: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    found = error_details_pb2.BadRequest()
    assert status.details[1].Unpack(found)
    return [(v.field, v.reason) for v in found.field_violations]


async def set_order_schema(gw: GatewayUnderTest, queue: str) -> pb.SetQueueSchemaResponse:
    await attach(gw, queue)
    response: pb.SetQueueSchemaResponse = await gw.queues.SetQueueSchema(
        pb.SetQueueSchemaRequest(queue=queue, json_schema=json.dumps(ORDER)), metadata=AUTH
    )
    return response


async def test_schema_rpcs_set_get_check_and_remove(gateway: GatewayUnderTest) -> None:
    queues = gateway.queues
    first = await set_order_schema(gateway, "gw-orders")
    assert first.version.version == 1 and json.loads(first.version.json_schema) == ORDER
    got = await queues.GetQueueSchema(pb.GetQueueSchemaRequest(queue="gw-orders"), metadata=AUTH)
    assert got.current_version == 1
    assert got.compatibility == pb.SCHEMA_COMPATIBILITY_BACKWARD
    assert [v.version for v in got.versions] == [1]
    messages = [order(id="a", qty=1), order(id="b")]
    checked = await queues.CheckQueueSchema(
        pb.CheckQueueSchemaRequest(queue="gw-orders", messages=messages), metadata=AUTH
    )
    assert checked.version == 1
    assert [(v.index, v.pointer, v.rule) for v in checked.violations] == [(1, "", "required")]

    incompatible = {**ORDER, "required": ["id", "qty", "sku"]}
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await queues.SetQueueSchema(
            pb.SetQueueSchemaRequest(queue="gw-orders", json_schema=json.dumps(incompatible)),
            metadata=AUTH,
        )
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(refused.value).reason == "SCHEMA_INCOMPATIBLE"
    assert violations(refused.value) == [("json_schema", "SCHEMA_INCOMPATIBLE")]
    with pytest.raises(grpc.aio.AioRpcError) as malformed:
        await queues.SetQueueSchema(
            pb.SetQueueSchemaRequest(queue="gw-orders", json_schema='{"type": 7}'), metadata=AUTH
        )
    assert error_info(malformed.value).reason == "INVALID_SCHEMA"
    full = await queues.SetQueueSchema(
        pb.SetQueueSchemaRequest(
            queue="gw-orders",
            json_schema=json.dumps(incompatible),
            compatibility=pb.SCHEMA_COMPATIBILITY_NONE,
        ),
        metadata=AUTH,
    )
    assert full.version.version == 2
    await queues.RemoveQueueSchema(pb.RemoveQueueSchemaRequest(queue="gw-orders"), metadata=AUTH)
    got = await queues.GetQueueSchema(pb.GetQueueSchemaRequest(queue="gw-orders"), metadata=AUTH)
    assert (got.current_version, got.compatibility) == (0, pb.SCHEMA_COMPATIBILITY_NONE)
    assert [v.version for v in got.versions] == [1, 2]


async def test_every_push_rpc_refuses_what_does_not_fit(gateway: GatewayUnderTest) -> None:
    queues = gateway.queues
    await set_order_schema(gateway, "gw-checked")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        messages = [order(id="a", qty=1), order(id="b", qty="7")]
        await queues.Push(pb.PushRequest(queue="gw-checked", messages=messages), metadata=AUTH)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(refused.value)
    assert (info.reason, info.metadata["schema_version"]) == ("SCHEMA", "1")
    assert violations(refused.value) == [("messages[1]/qty", "type")]

    many = await queues.PushMany(
        pb.PushManyRequest(
            pushes=[
                pb.PushRequest(queue="gw-checked", messages=[order(id="c", qty=2)]),
                pb.PushRequest(queue="gw-checked", messages=[order(qty=2)]),
            ]
        ),
        metadata=AUTH,
    )
    ok, bad = many.outcomes
    assert ok.WhichOneof("outcome") == "result"
    assert bad.WhichOneof("outcome") == "error"
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    packed = error_details_pb2.BadRequest()
    assert bad.error.details[1].Unpack(packed)
    assert [v.field for v in packed.field_violations] == ["messages[0]"]

    stream = queues.PushStream(metadata=AUTH)
    for sequence, message in ((1, order(id="x")), (2, order(id="d", qty=3))):
        push = pb.PushRequest(queue="gw-checked", messages=[message])
        await stream.write(pb.PushStreamRequest(sequence=sequence, push=push))
    outcomes: dict[int, str | None] = {}
    while len(outcomes) < 2:
        response = await stream.read()
        for outcome in response.outcomes:
            outcomes[outcome.sequence] = outcome.WhichOneof("outcome")
    await stream.done_writing()
    assert outcomes == {1: "error", 2: "result"}

    consume = pb.ConsumeRequest(queue="gw-checked", mode=types_pb2.CONSUME_MODE_AT_MOST_ONCE, max=2)
    _, deliveries = await collect(gateway, consume, 2)
    assert [json.loads(d.message.payload)["id"] for d in deliveries] == ["c", "d"]
    assert {d.message.schema_version for d in deliveries} == {1}


async def test_a_grpcurl_push_that_does_not_fit_names_the_field(gateway: GatewayUnderTest) -> None:
    await set_order_schema(gateway, "gw-curl")
    grpcurl = _tool("grpcurl")
    auth = ["-plaintext", "-H", f"authorization: Bearer {SECRETS[0]}"]
    body = json.dumps(
        {
            "queue": "gw-curl",
            "messages": [{"payload": "eyJpZCI6ICJhIn0=", "kind": "PAYLOAD_KIND_JSON"}],
        }
    )  # {"id": "a"}: qty is missing
    code, out = await _run(grpcurl, *auth, "-d", body, gateway.target, "busmq.v1.QueueService/Push")
    assert code != 0
    assert "InvalidArgument" in out and "messages[0]" in out and "required" in out, out


async def test_a_protobuf_type_is_set_and_enforced_through_the_gateway(
    gateway: GatewayUnderTest,
) -> None:
    from tests.core.test_protobuf_schema import BASE, order_class

    await attach(gateway, "gw-proto")
    schema = pb.ProtobufSchema(descriptor_set=BASE, message="shop.Order")
    made = await gateway.queues.SetQueueSchema(
        pb.SetQueueSchemaRequest(queue="gw-proto", protobuf=schema), metadata=AUTH
    )
    assert made.version.protobuf.message == "shop.Order" and not made.version.json_schema
    got = await gateway.queues.GetQueueSchema(
        pb.GetQueueSchemaRequest(queue="gw-proto"), metadata=AUTH
    )
    assert got.versions[0].protobuf.descriptor_set == BASE
    good = order_class(BASE)(id="o-1", qty=1).SerializeToString()
    raw = types_pb2.PAYLOAD_KIND_BYTES
    messages = [
        types_pb2.OutgoingMessage(payload=good, kind=raw),
        types_pb2.OutgoingMessage(payload=b"\xff\xff", kind=raw),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gateway.queues.Push(
            pb.PushRequest(queue="gw-proto", messages=messages), metadata=AUTH
        )
    assert error_info(refused.value).reason == "SCHEMA"
    assert violations(refused.value) == [("messages[1]", "protobuf")]
    await gateway.queues.Push(
        pb.PushRequest(queue="gw-proto", messages=messages[:1]), metadata=AUTH
    )
    with pytest.raises(grpc.aio.AioRpcError) as malformed:
        await gateway.queues.SetQueueSchema(
            pb.SetQueueSchemaRequest(
                queue="gw-proto", protobuf=pb.ProtobufSchema(descriptor_set=BASE, message="shop.X")
            ),
            metadata=AUTH,
        )
    assert error_info(malformed.value).reason == "INVALID_SCHEMA"
