"""Every QueueService RPC through the generated Python stub, against a real core and Redis."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import types_pb2
from tests.gateway.conftest import AUTH, GatewayUnderTest

TEXT = types_pb2.PAYLOAD_KIND_TEXT
JSON = types_pb2.PAYLOAD_KIND_JSON


def text(value: str, **headers: str) -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=value.encode(), kind=TEXT, headers=headers)


async def attach(gw: GatewayUnderTest, queue: str, **fields: object) -> pb.AttachQueueResponse:
    response: pb.AttachQueueResponse = await gw.queues.AttachQueue(
        pb.AttachQueueRequest(queue=queue, **fields),
        metadata=AUTH,  # type: ignore[arg-type]
    )
    return response


async def collect(
    gw: GatewayUnderTest, request: pb.ConsumeRequest, n: int
) -> tuple[str, list[types_pb2.Delivery]]:
    """Open a Consume stream, return its consumer id and the first n deliveries."""
    call = gw.queues.Consume(request, metadata=AUTH)
    consumer_id, deliveries = "", []
    async for response in call:
        if response.HasField("started"):
            consumer_id = response.started.consumer_id
            if n == 0:
                break
        elif response.HasField("delivery"):
            deliveries.append(response.delivery)
            if len(deliveries) == n:
                break
    call.cancel()
    return consumer_id, deliveries


def error_reason(error: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return str(info.reason)


async def test_attach_push_consume_at_most_once_and_detach(gateway: GatewayUnderTest) -> None:
    attached = await attach(gateway, "orders", ttl=duration_pb2.Duration(seconds=60))
    assert attached.created and attached.attachment_id
    assert attached.lease_duration.seconds == 3
    pushed = await gateway.queues.Push(
        pb.PushRequest(
            queue="orders",
            messages=[
                text("one", trace="t1"),
                types_pb2.OutgoingMessage(payload=b'{"n": 2}', kind=JSON),
                types_pb2.OutgoingMessage(payload=b"\x00\x01"),
            ],
        ),
        metadata=AUTH,
    )
    assert list(pushed.ids) == [1, 2, 3] and not pushed.duplicate
    consumer_id, got = await collect(gateway, pb.ConsumeRequest(queue="orders", max=3), 3)
    assert consumer_id
    assert [d.message.id for d in got] == [1, 2, 3]
    assert got[0].message.payload == b"one" and dict(got[0].message.headers) == {"trace": "t1"}
    assert json.loads(got[1].message.payload) == {"n": 2}
    assert got[2].message.kind == types_pb2.PAYLOAD_KIND_BYTES
    assert got[0].message.push_time.seconds > 0
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="orders"), metadata=AUTH)
    assert (info.count, info.last_id) == (0, 3)
    await gateway.queues.RenewAttachment(
        pb.RenewAttachmentRequest(attachment_id=attached.attachment_id), metadata=AUTH
    )
    await gateway.queues.DetachQueue(
        pb.DetachQueueRequest(attachment_id=attached.attachment_id), metadata=AUTH
    )
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await gateway.queues.DetachQueue(
            pb.DetachQueueRequest(attachment_id=attached.attachment_id), metadata=AUTH
        )
    assert gone.value.code() is grpc.StatusCode.NOT_FOUND


async def test_push_with_request_id_is_idempotent(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "idem")
    request = pb.PushRequest(queue="idem", messages=[text("a"), text("b")], request_id="r-1")
    first = await gateway.queues.Push(request, metadata=AUTH)
    again = await gateway.queues.Push(request, metadata=AUTH)
    assert list(first.ids) == list(again.ids) == [1, 2]
    assert again.duplicate and not first.duplicate


async def test_at_least_once_over_a_stream_with_ack_nack_and_cumulative_ack(
    gateway: GatewayUnderTest,
) -> None:
    await attach(gateway, "work")
    await gateway.queues.Push(
        pb.PushRequest(queue="work", messages=[text(str(i)) for i in range(6)]), metadata=AUTH
    )
    call = gateway.queues.Consume(
        pb.ConsumeRequest(
            queue="work",
            mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE,
            visibility_timeout=duration_pb2.Duration(seconds=60),
        ),
        metadata=AUTH,
    )
    stream = call.__aiter__()
    started = await stream.__anext__()
    consumer_id = started.started.consumer_id

    async def next_delivery() -> types_pb2.Delivery:
        while True:
            response = await stream.__anext__()
            if response.HasField("delivery"):
                return response.delivery

    first = [await next_delivery() for _ in range(6)]
    acked = await gateway.queues.Ack(
        pb.AckRequest(queue="work", ids=[first[0].message.id, 999]), metadata=AUTH
    )
    assert acked.acked == 1 and list(acked.unknown_ids) == [999]
    await gateway.queues.Nack(
        pb.NackRequest(queue="work", consumer_id=consumer_id, ids=[first[1].message.id]),
        metadata=AUTH,
    )
    redelivered = await next_delivery()
    assert (redelivered.message.id, redelivered.delivery_count) == (2, 2)
    upto = await gateway.queues.Ack(
        pb.AckRequest(queue="work", up_to_id=6, consumer_id=consumer_id), metadata=AUTH
    )
    assert upto.acked == 5
    call.cancel()
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="work"), metadata=AUTH)
    assert info.count == 0


async def test_unacked_deliveries_of_a_cancelled_stream_are_redelivered(
    gateway: GatewayUnderTest,
) -> None:
    await attach(gateway, "handover")
    await gateway.queues.Push(
        pb.PushRequest(queue="handover", messages=[text(str(i)) for i in range(5)]), metadata=AUTH
    )
    alo = types_pb2.CONSUME_MODE_AT_LEAST_ONCE
    long = duration_pb2.Duration(seconds=300)
    _, first = await collect(
        gateway, pb.ConsumeRequest(queue="handover", mode=alo, visibility_timeout=long), 3
    )
    assert [d.message.id for d in first] == [1, 2, 3]
    # The first stream was cancelled without acking: a new stream gets all five well
    # before the 300 s timeout, those the first stream was sent marked as redelivered
    # (the gateway may have written more than the three the client read).
    _, second = await collect(
        gateway, pb.ConsumeRequest(queue="handover", mode=alo, visibility_timeout=long), 5
    )
    assert sorted(d.message.id for d in second) == [1, 2, 3, 4, 5]
    counts = {d.message.id: d.delivery_count for d in second}
    assert counts[1] == counts[2] == counts[3] == 2


async def test_replay_streams_from_an_id_and_from_latest(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "history", max_length=100)
    await gateway.queues.Push(
        pb.PushRequest(queue="history", messages=[text(c) for c in "abc"]), metadata=AUTH
    )
    replay = types_pb2.CONSUME_MODE_REPLAY
    _, from_two = await collect(
        gateway, pb.ConsumeRequest(queue="history", mode=replay, from_id=2), 2
    )
    assert [d.message.payload for d in from_two] == [b"b", b"c"]
    latest = gateway.queues.Consume(
        pb.ConsumeRequest(queue="history", mode=replay, from_latest=True), metadata=AUTH
    )
    stream = latest.__aiter__()
    assert (await stream.__anext__()).HasField("started")
    await gateway.queues.Push(pb.PushRequest(queue="history", messages=[text("d")]), metadata=AUTH)
    while not (response := await stream.__anext__()).HasField("delivery"):
        pass
    assert response.delivery.message.payload == b"d"
    latest.cancel()


async def test_idle_streams_get_heartbeats(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "quiet")
    call = gateway.queues.Consume(pb.ConsumeRequest(queue="quiet"), metadata=AUTH)
    kinds = []
    async for response in call:
        kinds.append(response.WhichOneof("event"))
        if kinds.count("heartbeat") == 2:
            break
    call.cancel()
    assert kinds == ["started", "heartbeat", "heartbeat"]


async def test_metadata_flush_and_close(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "managed")
    await gateway.queues.UpdateQueueMetadata(
        pb.UpdateQueueMetadataRequest(queue="managed", metadata={"owner": "ops"}), metadata=AUTH
    )
    await gateway.queues.Push(pb.PushRequest(queue="managed", messages=[text("x")]), metadata=AUTH)
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="managed"), metadata=AUTH)
    assert dict(info.metadata) == {"owner": "ops"} and info.count == 1 and info.ttl.seconds > 0
    await gateway.queues.FlushQueue(pb.FlushQueueRequest(queue="managed"), metadata=AUTH)
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="managed"), metadata=AUTH)
    assert info.count == 0 and info.last_id == 1
    await gateway.queues.CloseQueue(pb.CloseQueueRequest(queue="managed"), metadata=AUTH)
    with pytest.raises(grpc.aio.AioRpcError) as closed:
        await gateway.queues.GetQueue(pb.GetQueueRequest(queue="managed"), metadata=AUTH)
    assert closed.value.code() is grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("request_", "code", "reason"),
    [
        (
            pb.PushRequest(queue="bad name", messages=[text("x")]),
            "INVALID_ARGUMENT",
            "INVALID_NAME",
        ),
        (pb.PushRequest(queue="missing", messages=[text("x")]), "NOT_FOUND", "QUEUE_NOT_FOUND"),
        (pb.PushRequest(queue="present", messages=[]), "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
        (
            pb.PushRequest(
                queue="present", messages=[types_pb2.OutgoingMessage(payload=b"{", kind=JSON)]
            ),
            "INVALID_ARGUMENT",
            "INVALID_MESSAGE",
        ),
        (
            pb.PushRequest(
                queue="present", messages=[types_pb2.OutgoingMessage(payload=b"\xff", kind=TEXT)]
            ),
            "INVALID_ARGUMENT",
            "INVALID_MESSAGE",
        ),
        (
            pb.PushRequest(
                queue="present", messages=[types_pb2.OutgoingMessage(payload=b"x" * 70_000)]
            ),
            "RESOURCE_EXHAUSTED",
            "MESSAGE_TOO_LARGE",
        ),
    ],
)
async def test_bad_pushes_get_clear_statuses_and_nothing_is_stored(
    gateway: GatewayUnderTest, request_: pb.PushRequest, code: str, reason: str
) -> None:
    await attach(gateway, "present")
    await gateway.queues.Push(
        pb.PushRequest(queue="present", messages=[text("kept")]), metadata=AUTH
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await gateway.queues.Push(request_, metadata=AUTH)
    assert error.value.code().name == code
    assert error_reason(error.value) == reason
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="present"), metadata=AUTH)
    assert info.count == 1  # what was accepted before is still there


async def test_bad_consume_requests_and_mode_conflicts(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "modal")
    cases = [
        (pb.ConsumeRequest(queue="nope"), grpc.StatusCode.NOT_FOUND),
        (pb.ConsumeRequest(queue="modal", mode=99), grpc.StatusCode.INVALID_ARGUMENT),  # type: ignore[arg-type]
        (pb.ConsumeRequest(queue="modal", prefetch=100_000), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.ConsumeRequest(queue="modal", from_id=3), grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for request, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            async for _ in gateway.queues.Consume(request, metadata=AUTH):
                pass
        assert error.value.code() is code, request
    _, _ = await collect(gateway, pb.ConsumeRequest(queue="modal", max=1), 0)
    with pytest.raises(grpc.aio.AioRpcError) as conflict:
        async for _ in gateway.queues.Consume(
            pb.ConsumeRequest(queue="modal", mode=types_pb2.CONSUME_MODE_REPLAY), metadata=AUTH
        ):
            pass
    assert conflict.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(conflict.value) == "MODE_CONFLICT"


async def test_a_thousand_concurrent_streams_open_and_close(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "crowd")

    async def open_and_close() -> bool:
        call = gateway.queues.Consume(pb.ConsumeRequest(queue="crowd"), metadata=AUTH)
        first = await call.__aiter__().__anext__()
        call.cancel()
        return first.HasField("started")

    results = await asyncio.gather(*(open_and_close() for _ in range(1000)))
    assert all(results)
    await asyncio.sleep(0)  # let the server notice the last cancellations
    pushed = await gateway.queues.Push(
        pb.PushRequest(queue="crowd", messages=[text("still")]), metadata=AUTH
    )
    _, got = await collect(gateway, pb.ConsumeRequest(queue="crowd", max=1), 1)
    assert [d.message.id for d in got] == list(pushed.ids)


async def test_batched_streams_carry_every_delivery_in_order(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "bulk")
    await gateway.queues.Push(
        pb.PushRequest(queue="bulk", messages=[text(str(i)) for i in range(500)]), metadata=AUTH
    )
    call = gateway.queues.Consume(
        pb.ConsumeRequest(queue="bulk", max=500, prefetch=100, batch=True), metadata=AUTH
    )
    ids: list[int] = []
    events = []
    async for response in call:
        events.append(response.WhichOneof("event"))
        if response.HasField("batch"):
            ids += [d.message.id for d in response.batch.deliveries]
    assert ids == list(range(1, 501))
    assert "delivery" not in events
    assert events.count("batch") < 500  # several deliveries per response
