"""Principals sharing a gateway stay apart.

Tokens are bound to the principal they were handed to: an attachment id, a consumer id,
a channel connection id or a served request id is refused to any other principal
(PERMISSION_DENIED, logged and counted, the token never echoed) even one that holds every
verb on the object, and keeps working for its owner. Quotas bound what a principal's
attachments keep alive (max_queues) and the backlog limit it may set (max_backlog)."""

from __future__ import annotations

import asyncio
import logging
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from busmq.v1 import channel_service_pb2 as cpb
from busmq.v1 import (
    channel_service_pb2_grpc,
    queue_service_pb2_grpc,
    request_service_pb2_grpc,
    types_pb2,
)
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import request_service_pb2 as rpb
from busmq_gateway import Gateway, GatewaySettings
from busmq_gateway.principals import load
from tests.conftest import fast_settings
from tests.gateway.conftest import error_info
from tests.support.redis_server import RedisServer

OPS = "ops-secret-0123456789-abcdef"
SHOP = "shop-secret-0123456789-abcdef"
TENANT = "tenant-secret-0123456789-abcdef"
EVERYTHING = """
[[principal.allow]]
queues = ["*"]
channels = ["*"]
services = ["*"]
verbs = ["*"]
"""
CONFIG = f"""
[[principal]]
name = "ops"
secrets = ["{OPS}"]
{EVERYTHING}
[[principal]]
name = "shop"
secrets = ["{SHOP}"]
{EVERYTHING}
[[principal]]
name = "tenant"
secrets = ["{TENANT}"]
max_queues = 2
max_backlog = 100
{EVERYTHING}
"""


def auth(secret: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {secret}"),)


OWNER, OTHER = auth(OPS), auth(SHOP)


def text(value: str) -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=value.encode(), kind=types_pb2.PAYLOAD_KIND_TEXT)


class Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        self.channels = channel_service_pb2_grpc.ChannelServiceStub(channel)
        self.requests = request_service_pb2_grpc.RequestServiceStub(channel)


@pytest.fixture
async def shared(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[tuple[Gateway, Stubs]]:
    (tmp_path / "gateway.toml").write_text(textwrap.dedent(CONFIG))
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        principals=load(tmp_path / "gateway.toml"),
        bus=fast_settings([redis_server.url]),
        grace_seconds=1,
    )
    gateway = Gateway(settings)
    await gateway.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}")
    try:
        yield gateway, Stubs(channel)
    finally:
        await channel.close()
        await gateway.stop()


async def assert_refused(call: Any, token_kind: str, token: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    error = caught.value
    assert error.code() is grpc.StatusCode.PERMISSION_DENIED, error
    info = error_info(error)
    assert info.reason == "PERMISSION_DENIED"
    assert dict(info.metadata) == {"principal": "shop", "token": token_kind}
    assert token not in (error.details() or "")


async def first_event(stream: Any, field: str) -> Any:
    async for response in stream:
        if response.WhichOneof("event") == field:
            return getattr(response, field)
    raise AssertionError(f"the stream ended before a {field}")


async def test_an_attachment_id_works_for_its_owner_only(
    shared: tuple[Gateway, Stubs], caplog: pytest.LogCaptureFixture
) -> None:
    gateway, stubs = shared
    caplog.set_level(logging.WARNING, logger="busmq_gateway.access")
    attached = await stubs.queues.AttachQueue(
        pb.AttachQueueRequest(queue="orders.eu"), metadata=OWNER
    )
    token = attached.attachment_id
    renew = pb.RenewAttachmentRequest(attachment_id=token)
    detach = pb.DetachQueueRequest(attachment_id=token)
    await assert_refused(
        stubs.queues.RenewAttachment(renew, metadata=OTHER), "attachment_id", token
    )
    await assert_refused(stubs.queues.DetachQueue(detach, metadata=OTHER), "attachment_id", token)
    await stubs.queues.RenewAttachment(renew, metadata=OWNER)  # still attached: refused above
    await stubs.queues.DetachQueue(detach, metadata=OWNER)
    assert gateway.access.refusals.totals[("shop", "PERMISSION_DENIED")] == 2
    assert "refused a call of principal shop" in caplog.text and token not in caplog.text


async def test_a_consumer_id_works_for_its_owner_only(shared: tuple[Gateway, Stubs]) -> None:
    gateway, stubs = shared
    await stubs.queues.AttachQueue(pb.AttachQueueRequest(queue="jobs"), metadata=OWNER)
    await stubs.queues.Push(pb.PushRequest(queue="jobs", messages=[text("a")]), metadata=OWNER)
    consume = pb.ConsumeRequest(queue="jobs", mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE)
    stream = stubs.queues.Consume(consume, metadata=OWNER)
    started = await first_event(stream, "started")
    delivery = await first_event(stream, "delivery")
    token = started.consumer_id
    ack = pb.AckRequest(queue="jobs", consumer_id=token, up_to_id=delivery.message.id)
    nack = pb.NackRequest(queue="jobs", consumer_id=token, ids=[delivery.message.id])
    reject = pb.RejectRequest(queue="jobs", consumer_id=token, ids=[delivery.message.id])
    await assert_refused(stubs.queues.Ack(ack, metadata=OTHER), "consumer_id", token)
    await assert_refused(stubs.queues.Nack(nack, metadata=OTHER), "consumer_id", token)
    await assert_refused(stubs.queues.Reject(reject, metadata=OTHER), "consumer_id", token)
    assert (await stubs.queues.Ack(ack, metadata=OWNER)).acked == 1
    stream.cancel()
    assert gateway.access.refusals.totals[("shop", "PERMISSION_DENIED")] == 3


async def test_a_channel_connection_id_works_for_its_owner_only(
    shared: tuple[Gateway, Stubs],
) -> None:
    gateway, stubs = shared
    connect = cpb.ConnectChannelRequest(channel="support", local_role="agent")
    stream = stubs.channels.ConnectChannel(connect, metadata=OWNER)
    token = (await first_event(stream, "started")).connection_id
    send = cpb.SendChannelRequest(connection_id=token, messages=[text("hello")])
    disconnect = cpb.DisconnectChannelRequest(connection_id=token)
    end = cpb.EndChannelRequest(connection_id=token)
    await assert_refused(stubs.channels.SendChannel(send, metadata=OTHER), "connection_id", token)
    await assert_refused(
        stubs.channels.DisconnectChannel(disconnect, metadata=OTHER), "connection_id", token
    )
    await assert_refused(stubs.channels.EndChannel(end, metadata=OTHER), "connection_id", token)
    assert len((await stubs.channels.SendChannel(send, metadata=OWNER)).ids) == 1
    await stubs.channels.DisconnectChannel(disconnect, metadata=OWNER)
    stream.cancel()
    assert gateway.access.refusals.totals[("shop", "PERMISSION_DENIED")] == 3


async def test_a_served_request_id_works_for_its_owner_only(
    shared: tuple[Gateway, Stubs],
) -> None:
    gateway, stubs = shared
    serve = stubs.requests.Serve(rpb.ServeRequest(service="pricing"), metadata=OWNER)
    await first_event(serve, "started")
    asked = rpb.CallRequest(service="pricing", request=text("quote"))
    call = asyncio.ensure_future(stubs.requests.Call(asked, metadata=OTHER))
    served = await first_event(serve, "request")
    token = served.request_id
    value = rpb.ReplyPayload(payload=b"42", kind=types_pb2.PAYLOAD_KIND_TEXT)
    reply = rpb.ReplyRequest(request_id=token, value=value)
    # The caller of the request is not the server: it may not answer its own request.
    await assert_refused(stubs.requests.Reply(reply, metadata=OTHER), "request_id", token)
    await stubs.requests.Reply(reply, metadata=OWNER)
    assert (await call).reply.payload == b"42"
    serve.cancel()
    assert gateway.access.refusals.totals[("shop", "PERMISSION_DENIED")] == 1


async def refused_over_quota(call: Any, reason: str) -> dict[str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value
    info = error_info(caught.value)
    assert info.reason == reason
    return dict(info.metadata)


async def test_a_principal_at_max_queues_attaches_again_after_a_detach(
    shared: tuple[Gateway, Stubs],
) -> None:
    gateway, stubs = shared
    tenant = auth(TENANT)

    async def attach(name: str) -> str:
        request = pb.AttachQueueRequest(queue=name)
        return (await stubs.queues.AttachQueue(request, metadata=tenant)).attachment_id

    first, _second = await attach("t.a"), await attach("t.b")
    again = await attach("t.a")  # a queue it holds already takes no more of its quota
    third = stubs.queues.AttachQueue(pb.AttachQueueRequest(queue="t.c"), metadata=tenant)
    metadata = await refused_over_quota(third, "QUEUE_QUOTA")
    assert metadata == {"principal": "tenant", "max_queues": "2"}
    # Another principal's attachments are its own: ops is not limited by tenant's quota.
    await stubs.queues.AttachQueue(pb.AttachQueueRequest(queue="t.c"), metadata=OWNER)

    await stubs.queues.DetachQueue(pb.DetachQueueRequest(attachment_id=first), metadata=tenant)
    third = stubs.queues.AttachQueue(pb.AttachQueueRequest(queue="t.c"), metadata=tenant)
    await refused_over_quota(third, "QUEUE_QUOTA")  # t.a is still held by its 2nd attach
    await stubs.queues.DetachQueue(pb.DetachQueueRequest(attachment_id=again), metadata=tenant)
    await attach("t.c")
    assert gateway.access.refusals.totals[("tenant", "QUEUE_QUOTA")] == 2


async def test_a_principal_may_not_raise_or_remove_a_backlog_limit_past_its_ceiling(
    shared: tuple[Gateway, Stubs],
) -> None:
    gateway, stubs = shared
    tenant = auth(TENANT)
    over = pb.AttachQueueRequest(queue="t.jobs", max_backlog=101)
    metadata = await refused_over_quota(stubs.queues.AttachQueue(over, metadata=tenant),
                                        "BACKLOG_QUOTA")  # fmt: skip
    assert metadata == {"principal": "tenant", "max_backlog": "100"}
    unbounded = pb.AttachQueueRequest(queue="t.jobs", remove_max_backlog=True)
    await refused_over_quota(stubs.queues.AttachQueue(unbounded, metadata=tenant), "BACKLOG_QUOTA")
    # Asking for none, it gets its ceiling: pushes past 100 waiting messages are refused.
    await stubs.queues.AttachQueue(pb.AttachQueueRequest(queue="t.jobs"), metadata=tenant)
    push = pb.PushRequest(queue="t.jobs", messages=[text(str(i)) for i in range(100)])
    await stubs.queues.Push(push, metadata=tenant)
    full = pb.PushRequest(queue="t.jobs", messages=[text("one too many")])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stubs.queues.Push(full, metadata=tenant)
    assert error_info(caught.value).reason == "QUEUE_FULL"
    within = pb.AttachQueueRequest(queue="t.jobs", max_backlog=50)
    await stubs.queues.AttachQueue(within, metadata=tenant)
    assert gateway.access.refusals.totals[("tenant", "BACKLOG_QUOTA")] == 2
