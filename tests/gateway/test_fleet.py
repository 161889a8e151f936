"""Gateways as a fleet: three gateways over one Redis, each call on another gateway.

Whatever a call names (an attachment, a consumer, a channel connection, a served
request) was handed out by one gateway and is used on the others: each id works on every
gateway, stays bound to its principal, and a principal's ``max_queues`` counts across
the fleet. The last test sends every call through gRPC's own ``round_robin`` balancer.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from busmq.v1 import channel_service_pb2 as cpb
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import request_service_pb2 as rpb
from busmq.v1 import types_pb2
from busmq_gateway import Gateway, GatewaySettings
from busmq_gateway.principals import load
from tests.conftest import fast_settings
from tests.gateway.conftest import error_info
from tests.gateway.test_principal_isolation import (
    CONFIG,
    OTHER,
    OWNER,
    TENANT,
    Stubs,
    auth,
    first_event,
    text,
)
from tests.support.redis_server import RedisServer

SECRET = "drain-secret-0123456789"
ANY = (("authorization", f"Bearer {SECRET}"),)


class Fleet:
    def __init__(self, gateways: list[Gateway], channels: list[grpc.aio.Channel]) -> None:
        self.gateways = gateways
        self.on = [Stubs(channel) for channel in channels]  # on[i]: calls to gateway i

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{g.port}" for g in self.gateways]

    @property
    def relayed(self) -> int:
        return sum(g.relay.relayed for g in self.gateways)


@pytest.fixture
async def fleet(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[Fleet]:
    (tmp_path / "gateway.toml").write_text(textwrap.dedent(CONFIG))
    principals = load(tmp_path / "gateway.toml")
    gateways = [
        Gateway(
            GatewaySettings(
                listen="127.0.0.1:0",
                principals=principals,
                bus=fast_settings([redis_server.url]),
                grace_seconds=1,
            )
        )
        for _ in range(3)
    ]
    channels: list[grpc.aio.Channel] = []
    try:
        for gateway in gateways:
            await gateway.start()
            channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}"))
        yield Fleet(gateways, channels)
    finally:
        for channel in channels:
            await channel.close()
        for gateway in gateways:
            await gateway.stop()


async def attachments_of(stubs: Stubs, queue: str) -> int:
    listed = await stubs.queues.ListQueues(pb.ListQueuesRequest(prefix=queue), metadata=OWNER)
    return next(q.attachments for q in listed.queues if q.queue == queue)


async def test_an_attachment_is_renewed_and_released_on_any_gateway(fleet: Fleet) -> None:
    a, b, c = fleet.on
    attached = await a.queues.AttachQueue(pb.AttachQueueRequest(queue="orders"), metadata=OWNER)
    renew = pb.RenewAttachmentRequest(attachment_id=attached.attachment_id)
    for stubs in (b, c, a, b):
        await stubs.queues.RenewAttachment(renew, metadata=OWNER)
    assert await attachments_of(c, "orders") == 1  # one attach, one attachment

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await c.queues.RenewAttachment(renew, metadata=OTHER)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED

    detach = pb.DetachQueueRequest(attachment_id=attached.attachment_id)
    await c.queues.DetachQueue(detach, metadata=OWNER)
    await b.queues.DetachQueue(detach, metadata=OWNER)  # a retry, on another gateway
    assert await attachments_of(a, "orders") == 0
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await a.queues.RenewAttachment(renew, metadata=OWNER)
    assert gone.value.code() is grpc.StatusCode.NOT_FOUND
    assert error_info(gone.value).reason == "ATTACHMENT_NOT_FOUND"


async def test_an_id_no_gateway_issued_is_not_found(fleet: Fleet) -> None:
    a, b, _ = fleet.on
    attached = await a.queues.AttachQueue(pb.AttachQueueRequest(queue="forged"), metadata=OWNER)
    body, mac = attached.attachment_id.split(".")
    forged = f"{body}.{'A' * len(mac)}"
    for attachment_id in (forged, "", "not-an-id", body):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await b.queues.RenewAttachment(
                pb.RenewAttachmentRequest(attachment_id=attachment_id), metadata=OWNER
            )
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND
        assert error_info(caught.value).reason == "ATTACHMENT_NOT_FOUND"
    # An id of one kind is not taken for another.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await b.queues.Ack(
            pb.AckRequest(queue="forged", consumer_id=attached.attachment_id, up_to_id=1),
            metadata=OWNER,
        )
    assert error_info(caught.value).reason == "CONSUMER_NOT_FOUND"


async def test_max_queues_counts_across_the_fleet(fleet: Fleet) -> None:
    a, b, c = fleet.on
    tenant = auth(TENANT)
    first = await a.queues.AttachQueue(pb.AttachQueueRequest(queue="t.one"), metadata=tenant)
    await b.queues.AttachQueue(pb.AttachQueueRequest(queue="t.two"), metadata=tenant)
    await c.queues.AttachQueue(pb.AttachQueueRequest(queue="t.one"), metadata=tenant)  # held
    with pytest.raises(grpc.aio.AioRpcError) as over:
        await c.queues.AttachQueue(pb.AttachQueueRequest(queue="t.three"), metadata=tenant)
    assert over.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(over.value).reason == "QUEUE_QUOTA"
    # One of t.one's two attachments released: it still holds t.one.
    await b.queues.DetachQueue(
        pb.DetachQueueRequest(attachment_id=first.attachment_id), metadata=tenant
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await a.queues.AttachQueue(pb.AttachQueueRequest(queue="t.three"), metadata=tenant)


async def test_a_consumer_is_settled_on_any_gateway(fleet: Fleet) -> None:
    a, b, c = fleet.on
    await a.queues.AttachQueue(pb.AttachQueueRequest(queue="jobs"), metadata=OWNER)
    await a.queues.Push(
        pb.PushRequest(queue="jobs", messages=[text(f"m{n}") for n in range(4)]), metadata=OWNER
    )
    stream = a.queues.Consume(
        pb.ConsumeRequest(queue="jobs", mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE),
        metadata=OWNER,
    )
    consumer_id = (await first_event(stream, "started")).consumer_id
    ids = [(await first_event(stream, "delivery")).message.id for _ in range(4)]
    acked = await b.queues.Ack(
        pb.AckRequest(queue="jobs", consumer_id=consumer_id, up_to_id=ids[1]), metadata=OWNER
    )
    assert acked.acked == 2
    rejected = await c.queues.Reject(
        pb.RejectRequest(queue="jobs", consumer_id=consumer_id, ids=ids[2:3]), metadata=OWNER
    )
    assert list(rejected.unknown_ids) == []
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await c.queues.Nack(
            pb.NackRequest(queue="jobs", consumer_id=consumer_id, ids=ids[3:]), metadata=OTHER
        )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    stream.cancel()
    info = await b.queues.GetQueue(pb.GetQueueRequest(queue="jobs"), metadata=OWNER)
    assert info.dead_letters == 1


async def test_a_reply_on_another_gateway_reaches_the_requester(fleet: Fleet) -> None:
    a, b, c = fleet.on
    served = a.requests.Serve(rpb.ServeRequest(service="pricing"), metadata=OWNER)
    await first_event(served, "started")

    async def handle() -> None:
        async for response in served:
            if response.WhichOneof("event") != "request":
                continue
            request = response.request
            payload = rpb.ReplyPayload(
                payload=request.message.payload.upper(), kind=request.message.kind
            )
            # Every other reply through another gateway than the one holding the stream.
            on = (b, c)[request.message.id % 2]
            if request.message.payload.startswith(b"stream"):
                for part in (b"one", b"two"):
                    chunk = rpb.ReplyPayload(payload=part, kind=request.message.kind)
                    await on.requests.Reply(
                        rpb.ReplyRequest(request_id=request.request_id, chunks={"items": [chunk]}),
                        metadata=OWNER,
                    )
                    on = b if on is c else c
                await on.requests.Reply(
                    rpb.ReplyRequest(request_id=request.request_id, chunks={"end": True}),
                    metadata=OWNER,
                )
                continue
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await on.requests.Reply(
                    rpb.ReplyRequest(request_id=request.request_id, value=payload), metadata=OTHER
                )
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
            await on.requests.Reply(
                rpb.ReplyRequest(request_id=request.request_id, value=payload), metadata=OWNER
            )

    handler = asyncio.create_task(handle())
    try:
        for n in range(6):
            called = await (b, c)[n % 2].requests.Call(
                rpb.CallRequest(service="pricing", request=text(f"quote {n}")), metadata=OWNER
            )
            assert called.reply.payload == f"QUOTE {n}".encode()
        items = [
            response.item.payload
            async for response in c.requests.CallStream(
                rpb.CallStreamRequest(service="pricing", request=text("stream")), metadata=OWNER
            )
            if response.WhichOneof("event") == "item"
        ]
        assert items == [b"one", b"two"]
        assert fleet.relayed >= 6
    finally:
        served.cancel()
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)


async def test_a_channel_connection_is_used_on_any_gateway(fleet: Fleet) -> None:
    a, b, c = fleet.on
    local = a.channels.ConnectChannel(cpb.ConnectChannelRequest(channel="chat"), metadata=OWNER)
    connection_id = (await first_event(local, "started")).connection_id
    remote = c.channels.ConnectChannel(  # listens: plays the remote role
        cpb.ConnectChannelRequest(channel="chat", listen=True), metadata=OWNER
    )
    await first_event(remote, "started")
    for n, stubs in enumerate((b, c, a)):
        await stubs.channels.SendChannel(
            cpb.SendChannelRequest(connection_id=connection_id, messages=[text(f"hi {n}")]),
            metadata=OWNER,
        )
    got = [(await first_event(remote, "delivery")).message.payload for _ in range(3)]
    assert got == [b"hi 0", b"hi 1", b"hi 2"]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await b.channels.SendChannel(
            cpb.SendChannelRequest(connection_id=connection_id, messages=[text("x")]),
            metadata=OTHER,
        )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    await b.channels.DisconnectChannel(
        cpb.DisconnectChannelRequest(connection_id=connection_id), metadata=OWNER
    )
    kinds = [r.state.kind async for r in local if r.WhichOneof("event") == "state"]
    assert kinds[-1] == "disconnected", kinds  # the stream on gateway a ended with it
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await c.channels.SendChannel(
            cpb.SendChannelRequest(connection_id=connection_id, messages=[text("late")]),
            metadata=OWNER,
        )
    assert error_info(gone.value).reason == "CONNECTION_NOT_FOUND"
    remote.cancel()


async def test_calls_spread_by_round_robin_land_anywhere(fleet: Fleet) -> None:
    """gRPC's round_robin policy over the three: a README-style flow, any call anywhere."""
    target = "ipv4:" + ",".join(fleet.targets)
    options: list[tuple[str, Any]] = [("grpc.lb_policy_name", "round_robin")]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        stubs = Stubs(channel)
        attached = await stubs.queues.AttachQueue(
            pb.AttachQueueRequest(queue="spread"), metadata=OWNER
        )
        for _ in range(6):
            await stubs.queues.RenewAttachment(
                pb.RenewAttachmentRequest(attachment_id=attached.attachment_id), metadata=OWNER
            )
        await stubs.queues.Push(
            pb.PushRequest(queue="spread", messages=[text(f"m{n}") for n in range(9)]),
            metadata=OWNER,
        )
        stream = stubs.queues.Consume(
            pb.ConsumeRequest(queue="spread", mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE),
            metadata=OWNER,
        )
        consumer_id = (await first_event(stream, "started")).consumer_id
        for _ in range(9):
            delivery = await first_event(stream, "delivery")
            await stubs.queues.Ack(
                pb.AckRequest(queue="spread", consumer_id=consumer_id, ids=[delivery.message.id]),
                metadata=OWNER,
            )
        stream.cancel()
        assert await attachments_of(stubs, "spread") == 1
        await stubs.queues.DetachQueue(
            pb.DetachQueueRequest(attachment_id=attached.attachment_id), metadata=OWNER
        )
        info = await stubs.queues.GetQueue(pb.GetQueueRequest(queue="spread"), metadata=OWNER)
        assert info.count == 0
        served = [unary_calls(g, ("RenewAttachment", "Ack")) for g in fleet.gateways]
        assert all(served) and sum(served) == 15, served


def unary_calls(gateway: Gateway, methods: tuple[str, ...]) -> float:
    """How many calls of ``methods`` ``gateway`` started."""
    return sum(
        sample.value
        for metric in gateway.registry.collect()
        if metric.name == "grpc_server_started"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["grpc_method"] in methods
    )


async def test_a_draining_gateway_is_not_ready_and_moves_its_streams(
    redis_server: RedisServer,
) -> None:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        secrets=(SECRET,),
        bus=fast_settings([redis_server.url]),
        http_listen="127.0.0.1:0",
        grace_seconds=2,
    )
    gateway = Gateway(settings)
    await gateway.start()
    assert gateway.http is not None
    ready = f"http://127.0.0.1:{gateway.http.port}/readyz"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
        stubs, health = Stubs(channel), health_pb2_grpc.HealthStub(channel)
        try:
            await stubs.queues.AttachQueue(pb.AttachQueueRequest(queue="moving"), metadata=ANY)
            await stubs.queues.Push(
                pb.PushRequest(queue="moving", messages=[text("m")]), metadata=ANY
            )
            stream = stubs.queues.Consume(
                pb.ConsumeRequest(queue="moving", mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE),
                metadata=ANY,
            )
            delivery = await first_event(stream, "delivery")
            assert await http_status(ready) == 200

            await gateway.begin_drain()
            assert (await first_event(stream, "state")).kind == "draining"
            assert [r async for r in stream] == [] and await stream.code() is grpc.StatusCode.OK
            checked = await health.Check(health_pb2.HealthCheckRequest())
            assert checked.status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await http_status(ready) == 503
            refused = stubs.queues.Consume(pb.ConsumeRequest(queue="moving"), metadata=ANY)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await first_event(refused, "started")
            assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
            assert error_info(caught.value).reason == "GATEWAY_DRAINING"
            # Unary calls are still served: the client settles what it holds.
            acked = await stubs.queues.Ack(
                pb.AckRequest(queue="moving", ids=[delivery.message.id]), metadata=ANY
            )
            assert acked.acked == 1
        finally:
            await gateway.stop()


async def http_status(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status
