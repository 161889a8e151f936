"""The gateway's servicers on ``grpc_testing`` (``tests/support/servicer_testing.py``): no
sockets, the guarded handlers the server registers, every status asserted exactly (code,
details, ErrorInfo reason and metadata, BadRequest), on a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2

from busmq.keys import QueueKeys
from busmq.v1 import channel_service_pb2 as cpb
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import request_service_pb2 as rpb
from busmq.v1 import types_pb2
from busmq_gateway import Gateway
from busmq_gateway.auth import AuthInterceptor
from busmq_gateway.principals import load
from tests.gateway.servicers import AUTH, SECRET, Servicers, in_process, unary
from tests.support.redis_server import RedisServer
from tests.support.servicer_testing import SERVICES, method, outcome
from tests.support.waiting import eventually


@pytest.fixture
async def servicers(redis_server: RedisServer) -> AsyncIterator[Servicers]:
    async with in_process(redis_server, secrets=(SECRET,)) as found:
        yield found


async def test_an_attach_answers_with_the_queue(servicers: Servicers) -> None:
    ttl = duration_pb2.Duration(seconds=60)
    done = await unary(servicers, "AttachQueue", pb.AttachQueueRequest(queue="orders", ttl=ttl))
    assert done.code is grpc.StatusCode.OK, done.details
    assert done.response.created and done.response.attachment_id
    again = await unary(servicers, "AttachQueue", pb.AttachQueueRequest(queue="orders", ttl=ttl))
    assert not again.response.created


async def test_no_secret_is_unauthenticated_with_its_reason(servicers: Servicers) -> None:
    done = await unary(servicers, "GetQueue", pb.GetQueueRequest(queue="orders"), metadata=())
    assert done.code is grpc.StatusCode.UNAUTHENTICATED
    assert done.reason()[0] == "UNAUTHENTICATED"


async def test_an_unknown_queue_is_not_found_naming_it(servicers: Servicers) -> None:
    done = await unary(servicers, "GetQueue", pb.GetQueueRequest(queue="nowhere"))
    assert done.code is grpc.StatusCode.NOT_FOUND
    reason, metadata = done.reason()
    assert (reason, metadata.get("queue")) == ("QUEUE_NOT_FOUND", "nowhere")


async def test_a_bad_queue_name_is_invalid_argument(servicers: Servicers) -> None:
    done = await unary(servicers, "GetQueue", pb.GetQueueRequest(queue="bad name\n"))
    assert done.code is grpc.StatusCode.INVALID_ARGUMENT
    assert done.reason()[0] == "INVALID_NAME"


async def test_a_push_off_the_schema_names_each_violation(
    servicers: Servicers,
) -> None:
    ttl = duration_pb2.Duration(seconds=60)
    await unary(servicers, "AttachQueue", pb.AttachQueueRequest(queue="orders", ttl=ttl))
    schema = '{"type": "object", "properties": {"qty": {"type": "integer"}}, "required": ["qty"]}'
    done = await unary(
        servicers, "SetQueueSchema", pb.SetQueueSchemaRequest(queue="orders", json_schema=schema)
    )
    assert done.code is grpc.StatusCode.OK, done.details
    json_kind = types_pb2.PAYLOAD_KIND_JSON
    messages = [
        types_pb2.OutgoingMessage(payload=b'{"qty": 1}', kind=json_kind),
        types_pb2.OutgoingMessage(payload=b'{"qty": "7"}', kind=json_kind),
    ]
    done = await unary(servicers, "Push", pb.PushRequest(queue="orders", messages=messages))
    assert done.code is grpc.StatusCode.INVALID_ARGUMENT
    reason, metadata = done.reason()
    assert (reason, metadata["schema_version"]) == ("SCHEMA", "1")
    bad_request = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad_request) for d in done.status().details if d.Is(bad_request.DESCRIPTOR))
    (violation,) = bad_request.field_violations
    assert (violation.field, violation.reason) == ("messages[1]/qty", "type")
    info = await unary(servicers, "GetQueue", pb.GetQueueRequest(queue="orders"))
    assert info.response.count == 0  # the batch was refused whole


async def test_a_consume_stream_cancelled_leaves_nothing_registered(
    servicers: Servicers, redis_server: RedisServer
) -> None:
    ttl = duration_pb2.Duration(seconds=60)
    await unary(servicers, "AttachQueue", pb.AttachQueueRequest(queue="jobs", ttl=ttl))
    request = pb.ConsumeRequest(queue="jobs", mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE)
    rpc = servicers.server.invoke_unary_stream(
        method("QueueService", "Consume"), AUTH, request, None
    )
    first = await asyncio.to_thread(rpc.take_response)
    assert first.WhichOneof("event") == "started"
    assert servicers.gateway.queues.active_streams == 1
    rpc.cancel()  # the client goes away: grpc.aio would cancel the servicer's task
    await eventually(lambda: servicers.gateway.queues.active_streams == 0, what="stream gone")
    admin = redis_server.client()
    try:
        (group,) = await admin.xinfo_groups(QueueKeys("jobs").stream)
        assert group["consumers"] == 0  # the stream's consumer left the group
    finally:
        await admin.aclose()


def _all_methods() -> list[tuple[str, str]]:
    return [(service.name, m.name) for service in SERVICES.values() for m in service.methods]


@pytest.mark.parametrize(("service", "name"), _all_methods(), ids=lambda part: str(part))
async def test_every_rpc_answers_an_empty_request_with_a_typed_status(
    servicers: Servicers, service: str, name: str
) -> None:
    """The classes of the fuzz corpus start here: every field at its default. Each RPC
    refuses with a mapped status and its ErrorInfo reason (never UNKNOWN or INTERNAL),
    or, where an empty request is valid, answers."""
    descriptor = method(service, name)
    request = _message_class(descriptor.input_type)()
    if descriptor.client_streaming:
        rpc = servicers.server.invoke_stream_stream(descriptor, AUTH, 10)
        rpc.send_request(request)
        rpc.requests_closed()
    elif descriptor.server_streaming:
        rpc = servicers.server.invoke_unary_stream(descriptor, AUTH, request, 10)
    else:
        rpc = servicers.server.invoke_unary_unary(descriptor, AUTH, request, 10)
    done = await outcome(rpc)
    assert done.code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (
        done.code,
        done.details,
    )
    if done.code is not grpc.StatusCode.OK:
        assert done.reason()[0], (done.code, done.details)  # an ErrorInfo says why
        assert done.details
    elif name == "PushStream":  # the stream goes on; the push is refused in its outcome
        (response,) = done.responses
        (refused,) = response.outcomes
        assert refused.WhichOneof("outcome") == "error"
        assert refused.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    else:
        assert name == "ListQueues"  # the one RPC an empty request is valid for
    print(f"{service}/{name}: {done.code.name} {done.reason()[0]}")


def _message_class(descriptor: Any) -> Any:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


SHOP, OPS = "shop-secret-0123456789-abcdef", "ops-secret-0123456789-abcdef"
PRINCIPALS = f"""
[[principal]]
name = "ops"
secrets = ["{OPS}"]
[[principal.allow]]
queues = ["*"]
verbs = ["*"]
[[principal]]
name = "shop"
secrets = ["{SHOP}"]
[[principal.allow]]
queues = ["shop.*"]
verbs = ["*"]
"""


@pytest.fixture
async def tenants(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[Servicers]:
    (tmp_path / "gateway.toml").write_text(PRINCIPALS)
    async with in_process(redis_server, principals=load(tmp_path / "gateway.toml")) as found:
        yield found


def bearer(secret: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {secret}"),)


async def test_a_queue_outside_the_principals_grants_is_permission_denied(
    tenants: Servicers,
) -> None:
    ttl = duration_pb2.Duration(seconds=60)
    mine = await unary(
        tenants, "AttachQueue", pb.AttachQueueRequest(queue="shop.carts", ttl=ttl), bearer(SHOP)
    )
    assert mine.code is grpc.StatusCode.OK, mine.details
    other = await unary(
        tenants, "AttachQueue", pb.AttachQueueRequest(queue="orders", ttl=ttl), bearer(SHOP)
    )
    assert other.code is grpc.StatusCode.PERMISSION_DENIED
    reason, metadata = other.reason()
    assert reason == "PERMISSION_DENIED"
    assert metadata["principal"] == "shop"
    assert tenants.gateway.access.refusals.totals[("shop", "PERMISSION_DENIED")] == 1


async def test_an_attachment_id_is_refused_to_another_principal(tenants: Servicers) -> None:
    ttl = duration_pb2.Duration(seconds=60)
    attached = await unary(
        tenants, "AttachQueue", pb.AttachQueueRequest(queue="shop.carts", ttl=ttl), bearer(OPS)
    )
    token = attached.response.attachment_id
    renew = pb.RenewAttachmentRequest(attachment_id=token)
    refused = await unary(tenants, "RenewAttachment", renew, bearer(SHOP))
    assert refused.code is grpc.StatusCode.PERMISSION_DENIED
    assert refused.reason() == (
        "PERMISSION_DENIED",
        {"principal": "shop", "token": "attachment_id"},
    )
    assert token not in refused.details  # the token is never echoed
    assert (await unary(tenants, "RenewAttachment", renew, bearer(OPS))).code is grpc.StatusCode.OK


async def test_a_consumer_id_is_refused_to_another_principal(tenants: Servicers) -> None:
    ttl = duration_pb2.Duration(seconds=60)
    await unary(
        tenants, "AttachQueue", pb.AttachQueueRequest(queue="shop.jobs", ttl=ttl), bearer(OPS)
    )
    request = pb.ConsumeRequest(queue="shop.jobs", mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE)
    stream = tenants.server.invoke_unary_stream(
        method("QueueService", "Consume"), bearer(OPS), request, None
    )
    started = (await asyncio.to_thread(stream.take_response)).started
    try:
        nack = pb.NackRequest(queue="shop.jobs", consumer_id=started.consumer_id, ids=[1])
        refused = await unary(tenants, "Nack", nack, bearer(SHOP))
        assert refused.code is grpc.StatusCode.PERMISSION_DENIED
        assert refused.reason() == (
            "PERMISSION_DENIED",
            {"principal": "shop", "token": "consumer_id"},
        )
        owner = await unary(tenants, "Nack", nack, bearer(OPS))
        assert owner.code is grpc.StatusCode.OK
        assert list(owner.response.unknown_ids) == [1]  # nothing was delivered
    finally:
        stream.cancel()
    await eventually(lambda: tenants.gateway.queues.active_streams == 0, what="stream gone")


async def test_a_call_nobody_serves_ends_deadline_exceeded_not_unknown(
    servicers: Servicers,
) -> None:
    request = rpb.CallRequest(
        service="pricing",
        request=types_pb2.OutgoingMessage(payload=b"{}", kind=types_pb2.PAYLOAD_KIND_JSON),
        timeout=duration_pb2.Duration(nanos=200_000_000),
    )
    rpc = servicers.server.invoke_unary_unary(method("RequestService", "Call"), AUTH, request, 10)
    done = await outcome(rpc)
    assert done.code is grpc.StatusCode.DEADLINE_EXCEEDED, (done.code, done.details)
    assert done.reason()[0]


def _streams(gateway: Gateway) -> dict[str, int]:
    """Every registry of open streams a gateway keeps."""
    return {
        "consume": gateway.queues.active_streams,
        "browse": gateway.queues.browses.active_streams,
        "push": gateway.queues.push_streams.active_streams,
        "channel": gateway.channels.streams.active_streams,
        "request": gateway.requests.streams.active_streams,
    }


def _message(payload: bytes = b"{}") -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=payload, kind=types_pb2.PAYLOAD_KIND_JSON)


STREAMS: dict[str, tuple[str, str, Any]] = {
    "BrowseQueue": ("QueueService", "browse", pb.BrowseQueueRequest(queue="jobs", follow=True)),
    "ConnectChannel": (
        "ChannelService",
        "channel",
        cpb.ConnectChannelRequest(channel="chat", local_role="a", remote_role="b"),
    ),
    "Serve": ("RequestService", "request", rpb.ServeRequest(service="pricing")),
    "CallStream": (
        "RequestService",
        "request",
        rpb.CallStreamRequest(
            service="pricing", request=_message(), timeout=duration_pb2.Duration(seconds=60)
        ),
    ),
    "PushStream": ("QueueService", "push", None),
}


@pytest.mark.parametrize("name", list(STREAMS))
async def test_a_cancelled_stream_leaves_nothing_registered(
    servicers: Servicers, name: str
) -> None:
    service, registry, request = STREAMS[name]
    ttl = duration_pb2.Duration(seconds=60)
    await unary(servicers, "AttachQueue", pb.AttachQueueRequest(queue="jobs", ttl=ttl))
    descriptor = method(service, name)
    if request is None:  # a client stream: opened, one push sent, left open
        rpc = servicers.server.invoke_stream_stream(descriptor, AUTH, None)
        rpc.send_request(pb.PushStreamRequest(sequence=1, push=pb.PushRequest(queue="jobs")))
    else:
        rpc = servicers.server.invoke_unary_stream(descriptor, AUTH, request, None)
    gateway = servicers.gateway
    await eventually(lambda: _streams(gateway)[registry] == 1, what=f"{name} open")
    rpc.cancel()
    await eventually(lambda: not any(_streams(gateway).values()), what=f"{name} gone")


@dataclass
class CallDetails:
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


class Aborts:
    """A servicer context that records the abort it is asked for."""

    code: grpc.StatusCode | None = None
    details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.code, self.details = code, details
        raise grpc.aio.AbortError()


REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


@pytest.mark.parametrize(
    ("path", "metadata", "passes"),
    [
        (REFLECTION, (), False),
        (REFLECTION, (("authorization", "Bearer not-a-secret-0123456789"),), False),
        (REFLECTION, AUTH, True),
        ("/grpc.health.v1.Health/Check", (), True),  # health is open
        ("/busmq.v1.QueueService/GetQueue", (), True),  # the guard's to refuse
    ],
)
async def test_the_auth_interceptor_guards_what_the_guard_does_not_see(
    servicers: Servicers, path: str, metadata: tuple[tuple[str, str], ...], passes: bool
) -> None:
    handler = grpc.stream_stream_rpc_method_handler(lambda requests, context: iter(()))

    async def continuation(details: Any) -> grpc.RpcMethodHandler:
        return handler

    interceptor = AuthInterceptor(servicers.gateway.access)
    found = await interceptor.intercept_service(continuation, CallDetails(path, metadata))
    assert (found is handler) is passes
    if not passes:
        context = Aborts()
        with pytest.raises(grpc.aio.AbortError):
            await anext(found.stream_stream(iter(()), context))
        assert context.code is grpc.StatusCode.UNAUTHENTICATED
        assert context.details == "missing or invalid credentials"
