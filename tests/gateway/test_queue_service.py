"""Every QueueService RPC through the generated Python stub, against a real core and Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from busmq import errors as core_errors
from busmq.federation.errors import from_rpc_error, from_status
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import types_pb2
from busmq_gateway.errors import MAX_METADATA_IDS, error_metadata, to_status
from tests.gateway.conftest import AUTH, GatewayUnderTest, error_info
from tests.support.waiting import eventually

pytestmark = pytest.mark.also_on_uvloop  # the same tests on uvloop's event loop

DETAILS_KEY = "grpc-status-details-bin"
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
    # A detach is safe to repeat (a client retries it on another gateway); the released
    # attachment is not renewed again.
    await gateway.queues.DetachQueue(
        pb.DetachQueueRequest(attachment_id=attached.attachment_id), metadata=AUTH
    )
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await gateway.queues.RenewAttachment(
            pb.RenewAttachmentRequest(attachment_id=attached.attachment_id), metadata=AUTH
        )
    assert gone.value.code() is grpc.StatusCode.NOT_FOUND


async def test_push_with_request_id_is_idempotent(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "idem")
    request = pb.PushRequest(queue="idem", messages=[text("a"), text("b")], request_id="r-1")
    first = await gateway.queues.Push(request, metadata=AUTH)
    again = await gateway.queues.Push(request, metadata=AUTH)
    assert list(first.ids) == list(again.ids) == [1, 2]
    assert again.duplicate and not first.duplicate


async def test_a_producer_sequence_is_stored_once_and_an_older_epoch_is_fenced(
    gateway: GatewayUnderTest,
) -> None:
    await attach(gateway, "seq")

    def push(value: str, epoch: int, sequence: int) -> pb.PushRequest:
        return pb.PushRequest(
            queue="seq",
            messages=[text(value)],
            producer="etl",
            producer_epoch=epoch,
            producer_sequence=sequence,
        )

    first = await gateway.queues.Push(push("a", 1, 5), metadata=AUTH)
    again = await gateway.queues.Push(push("a", 1, 5), metadata=AUTH)
    assert list(first.ids) == list(again.ids) == [1]
    assert again.duplicate and not first.duplicate
    older = await gateway.queues.Push(push("a", 1, 4), metadata=AUTH)
    assert older.duplicate and list(older.ids) == []
    assert list((await gateway.queues.Push(push("b", 2, 0), metadata=AUTH)).ids) == [2]
    info = error_info(await refused(gateway.queues.Push(push("late", 1, 6), metadata=AUTH)))
    assert info.reason == "PRODUCER_FENCED"
    assert dict(info.metadata) == {
        "queue": "seq",
        "producer": "etl",
        "epoch": "1",
        "current_epoch": "2",
    }
    count = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="seq"), metadata=AUTH)
    assert count.count == 2


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


async def test_an_ordered_queues_cancelled_stream_keeps_its_unacked_deliveries_leased(
    gateway: GatewayUnderTest,
) -> None:
    # A stream that broke is not a client that died: its handlers may still run. On an
    # ordered queue a prompt redelivery would run a key's message twice at once and let
    # the key's next message overtake it, so the deliveries stay leased until their
    # visibility timeout (the gateway's own read-ahead is given back at once).
    await attach(gateway, "ordered-handover")
    await gateway.queues.UpdateQueueControls(
        pb.UpdateQueueControlsRequest(queue="ordered-handover", ordering_key="k"), metadata=AUTH
    )
    keys = ["a", "a", "b", "c"]
    await gateway.queues.Push(
        pb.PushRequest(queue="ordered-handover", messages=[text(k, k=k) for k in keys]),
        metadata=AUTH,
    )
    alo = types_pb2.CONSUME_MODE_AT_LEAST_ONCE
    long = duration_pb2.Duration(seconds=300)
    request = pb.ConsumeRequest(queue="ordered-handover", mode=alo, visibility_timeout=long)
    _, first = await collect(gateway, request, 1)
    assert [d.message.id for d in first] == [1]
    service = gateway.gateway.queues
    await eventually(lambda: service.no_streams.is_set(), timeout=10, what="the stream's end")
    # The key of 1 stays held by it: 2 waits. What the first stream was sent and did not
    # read comes again (3 and 4 were sent or read ahead: redelivered after the timeout,
    # or given back at once), so a new stream gets the other keys' messages only.
    await gateway.queues.Push(
        pb.PushRequest(queue="ordered-handover", messages=[text("d", k="d")]), metadata=AUTH
    )
    call = gateway.queues.Consume(request, metadata=AUTH)
    received: list[int] = []
    async for response in call:
        if response.HasField("delivery"):
            received.append(response.delivery.message.id)
            if 5 in received:
                break
    call.cancel()
    assert 1 not in received and 2 not in received, received
    info = await gateway.queues.GetQueue(
        pb.GetQueueRequest(queue="ordered-handover"), metadata=AUTH
    )
    assert info.ordered_keys_in_flight >= 1


async def test_a_give_back_returns_a_delivery_as_it_is_and_is_not_a_failure(
    gateway: GatewayUnderTest,
) -> None:
    # What a client dropped unhanded when its stream ended: given back for the next read
    # (owner-scoped: tests/core/test_redelivery.py); a delay or an error is refused.
    await attach(gateway, "give-back")
    await gateway.queues.Push(
        pb.PushRequest(queue="give-back", messages=[text("a")]), metadata=AUTH
    )
    alo = types_pb2.CONSUME_MODE_AT_LEAST_ONCE
    request = pb.ConsumeRequest(
        queue="give-back", mode=alo, visibility_timeout=duration_pb2.Duration(seconds=60)
    )
    call = gateway.queues.Consume(request, metadata=AUTH)
    stream = call.__aiter__()
    consumer_id = (await stream.__anext__()).started.consumer_id

    async def next_delivery() -> types_pb2.Delivery:
        while True:
            response = await stream.__anext__()
            if response.HasField("delivery"):
                return response.delivery

    assert (await next_delivery()).message.id == 1
    for refused_fields in ({"delay": duration_pb2.Duration(seconds=1)}, {"error": "boom"}):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gateway.queues.Nack(
                pb.NackRequest(
                    queue="give-back",
                    consumer_id=consumer_id,
                    ids=[1],
                    give_back=True,
                    **refused_fields,  # type: ignore[arg-type]
                ),
                metadata=AUTH,
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    given = await gateway.queues.Nack(
        pb.NackRequest(queue="give-back", consumer_id=consumer_id, ids=[1, 7], give_back=True),
        metadata=AUTH,
    )
    assert list(given.unknown_ids) == [7]
    again = await next_delivery()
    assert (again.message.id, again.delivery_count) == (1, 2)
    call.cancel()


async def test_a_stream_whose_queue_expires_under_it_ends_not_found(
    gateway: GatewayUnderTest,
) -> None:
    # Its attachment was not renewed: the queue is gone, and its at-least-once consumer
    # learns it from its next claim of overdue deliveries (where it was INTERNAL).
    await gateway.queues.AttachQueue(
        pb.AttachQueueRequest(queue="expiring", ttl=duration_pb2.Duration(seconds=1)),
        metadata=AUTH,
    )
    await gateway.queues.Push(pb.PushRequest(queue="expiring", messages=[text("a")]), metadata=AUTH)
    alo = types_pb2.CONSUME_MODE_AT_LEAST_ONCE
    call = gateway.queues.Consume(pb.ConsumeRequest(queue="expiring", mode=alo), metadata=AUTH)
    kinds = []
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async for response in call:
            kinds.append(response.WhichOneof("event"))
    assert kinds[:2] == ["started", "delivery"]
    assert ended.value.code() is grpc.StatusCode.NOT_FOUND
    assert error_info(ended.value).reason == "QUEUE_NOT_FOUND"


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


async def refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    """The error of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value


async def test_refusals_carry_their_facts_in_error_info_metadata(
    gateway: GatewayUnderTest,
) -> None:
    queues = gateway.queues
    await attach(gateway, "capped", max_backlog=2)
    await queues.Push(
        pb.PushRequest(queue="capped", messages=[text("1"), text("2")]), metadata=AUTH
    )
    cases: list[tuple[Callable[[], Awaitable[object]], str, dict[str, str]]] = [
        (
            lambda: queues.Push(
                pb.PushRequest(queue="capped", messages=[text("3")]), metadata=AUTH
            ),
            "QUEUE_FULL",
            {"queue": "capped", "max_backlog": "2"},
        ),
        (
            lambda: queues.Push(
                pb.PushRequest(queue="absent", messages=[text("x")]), metadata=AUTH
            ),
            "QUEUE_NOT_FOUND",
            {"queue": "absent"},
        ),
        (
            lambda: queues.GetQueue(pb.GetQueueRequest(queue="absent"), metadata=AUTH),
            "QUEUE_NOT_FOUND",
            {"queue": "absent"},
        ),
        (
            lambda: queues.CloseQueue(pb.CloseQueueRequest(queue="absent"), metadata=AUTH),
            "QUEUE_NOT_FOUND",
            {"queue": "absent"},
        ),
    ]
    for call, reason, metadata in cases:
        info = error_info(await refused(call()))
        assert (info.reason, info.domain) == (reason, "busmq.dev")
        assert dict(info.metadata) == metadata

    bad_name = await refused(
        queues.Push(pb.PushRequest(queue="bad name", messages=[text("x")]), metadata=AUTH)
    )
    info = error_info(bad_name)
    assert info.reason == "INVALID_NAME" and info.metadata["name"] == "bad name"
    assert info.metadata["detail"] and info.metadata["detail"] in (bad_name.details() or "")

    large = types_pb2.OutgoingMessage(payload=b"x" * 70_000)
    too_large = error_info(
        await refused(queues.Push(pb.PushRequest(queue="capped", messages=[large]), metadata=AUTH))
    )
    assert too_large.reason == "MESSAGE_TOO_LARGE"
    assert too_large.metadata["limit"] == str(64 * 1024)
    assert int(too_large.metadata["size"]) >= 70_000

    _, _ = await collect(gateway, pb.ConsumeRequest(queue="capped", max=1), 0)
    with pytest.raises(grpc.aio.AioRpcError) as conflict:
        async for _ in queues.Consume(
            pb.ConsumeRequest(queue="capped", mode=types_pb2.CONSUME_MODE_REPLAY), metadata=AUTH
        ):
            pass
    info = error_info(conflict.value)
    assert info.reason == "MODE_CONFLICT"
    assert dict(info.metadata) == {
        "queue": "capped",
        "current_mode": "destructive",
        "requested_mode": "replay",
    }


@pytest.mark.parametrize(
    "exc",
    [
        core_errors.QueueNotFoundError("gone"),
        core_errors.QueueFullError("capped", 7),
        core_errors.MessageTooLargeError(70_001, 65_536),
        core_errors.ModeConflictError("modal", "replay", "destructive"),
        core_errors.UnknownMessageError("work", [3, 5, 8]),
        core_errors.NotAttachedError("detached"),
        core_errors.InvalidNameError("bad name", "spaces are not allowed"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_a_federated_client_rebuilds_each_core_error_from_the_metadata_alone(
    exc: core_errors.BusError,
) -> None:
    sent = to_status(exc)
    status = status_pb2.Status.FromString(dict(sent.trailing_metadata)[DETAILS_KEY])
    # A message that says nothing: the facts must come from the ErrorInfo metadata.
    status.message = "refused"
    trailers = grpc.aio.Metadata((DETAILS_KEY, status.SerializeToString()))
    error = grpc.aio.AioRpcError(sent.code, grpc.aio.Metadata(), trailers, "refused")
    rebuilt = from_rpc_error(error, queue="caller-queue", target="http://a:1")
    assert type(rebuilt) is type(exc)
    assert str(rebuilt) == str(exc)
    assert vars(rebuilt) == vars(exc)


def test_unknown_ids_in_error_metadata_are_bounded() -> None:
    metadata = error_metadata(core_errors.UnknownMessageError("work", list(range(1, 10_001))))
    assert metadata["ids_total"] == "10000"
    assert metadata["ids"].split(",") == [str(i) for i in range(1, MAX_METADATA_IDS + 1)]


async def test_attach_can_set_keep_and_remove_a_backlog_limit(gateway: GatewayUnderTest) -> None:
    def push(value: str) -> Awaitable[object]:
        request = pb.PushRequest(queue="limited", messages=[text(value)])
        return gateway.queues.Push(request, metadata=AUTH)

    await attach(gateway, "limited", max_backlog=1)
    await push("first")
    assert error_reason(await refused(push("refused"))) == "QUEUE_FULL"
    await attach(gateway, "limited")  # max_backlog 0 and no removal: the limit stays
    assert error_reason(await refused(push("still refused"))) == "QUEUE_FULL"
    both = await refused(attach(gateway, "limited", max_backlog=5, remove_max_backlog=True))
    assert both.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(await refused(push("the refused attach changed nothing"))) == "QUEUE_FULL"
    await attach(gateway, "limited", remove_max_backlog=True)
    for i in range(5):
        await push(f"accepted {i}")
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="limited"), metadata=AUTH)
    assert info.count == 6
    await attach(gateway, "limited", max_backlog=6)  # and a limit can be set again
    assert error_reason(await refused(push("full again"))) == "QUEUE_FULL"


# -- PushMany ------------------------------------------------------------------------


async def push_many(gw: GatewayUnderTest, *pushes: pb.PushRequest) -> list[pb.PushOutcome]:
    response = await gw.queues.PushMany(pb.PushManyRequest(pushes=pushes), metadata=AUTH)
    return list(response.outcomes)


async def test_push_many_stores_every_push_in_order_per_queue_and_dedupes_request_ids(
    gateway: GatewayUnderTest,
) -> None:
    await attach(gateway, "left")
    await attach(gateway, "right")
    outcomes = await push_many(
        gateway,
        pb.PushRequest(queue="left", messages=[text("l1"), text("l2")]),
        pb.PushRequest(queue="right", messages=[text("r1")], request_id="once"),
        pb.PushRequest(queue="left", messages=[text("l3")], request_id="first"),
        pb.PushRequest(queue="right", messages=[text("r2")]),
        pb.PushRequest(queue="left", messages=[text("l3")], request_id="first"),  # a retry
        pb.PushRequest(queue="left", messages=[text("l4")]),
    )
    assert [o.WhichOneof("outcome") for o in outcomes] == ["result"] * 6
    results = [(list(o.result.ids), o.result.duplicate) for o in outcomes]
    assert results == [
        ([1, 2], False),
        ([1], False),
        ([3], False),
        ([2], False),
        ([3], True),  # the same request_id in the same call: stored once
        ([4], False),
    ]
    # A later call retrying a push it may have lost gets the original ids back.
    again = await push_many(
        gateway, pb.PushRequest(queue="right", messages=[text("r1")], request_id="once")
    )
    assert (list(again[0].result.ids), again[0].result.duplicate) == ([1], True)
    _, left = await collect(gateway, pb.ConsumeRequest(queue="left", max=4), 4)
    _, right = await collect(gateway, pb.ConsumeRequest(queue="right", max=2), 2)
    assert [d.message.payload for d in left] == [b"l1", b"l2", b"l3", b"l4"]
    assert [d.message.payload for d in right] == [b"r1", b"r2"]


async def test_a_failed_push_of_a_push_many_gets_the_status_push_would_end_with(
    gateway: GatewayUnderTest,
) -> None:
    await attach(gateway, "present")
    large = types_pb2.OutgoingMessage(payload=b"x" * 70_000)
    failing = [
        pb.PushRequest(queue="absent", messages=[text("x")]),
        pb.PushRequest(queue="present", messages=[large]),
        pb.PushRequest(queue="bad name", messages=[text("x")]),
        pb.PushRequest(queue="present", messages=[]),
    ]
    ok = pb.PushRequest(queue="present", messages=[text("kept")])
    outcomes = await push_many(gateway, ok, *failing, ok)
    kinds = [o.WhichOneof("outcome") for o in outcomes]
    assert kinds == ["result", "error", "error", "error", "error", "result"]
    assert [list(o.result.ids) for o in (outcomes[0], outcomes[-1])] == [[1], [2]]
    for request, outcome in zip(failing, outcomes[1:-1], strict=True):
        alone = await refused(gateway.queues.Push(request, metadata=AUTH))
        sent = status_pb2.Status.FromString(dict(alone.trailing_metadata())[DETAILS_KEY])
        assert outcome.error == sent, request.queue  # code, message and ErrorInfo
        # ... so a federated client rebuilds the same exception from either.
        via_many = from_status(outcome.error, queue=request.queue, target="http://a:1")
        via_push = from_rpc_error(alone, queue=request.queue, target="http://a:1")
        assert (type(via_many), vars(via_many)) == (type(via_push), vars(via_push))
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="present"), metadata=AUTH)
    assert info.count == 2


@pytest.mark.parametrize(
    ("pushes", "code"),
    [
        ([], "INVALID_ARGUMENT"),
        ([pb.PushRequest(queue="bounded", messages=[text("x")])] * 10_001, "INVALID_ARGUMENT"),
        (
            [pb.PushRequest(queue="bounded", messages=[text("x")] * 5_000)] * 2
            + [pb.PushRequest(queue="bounded", messages=[text("one too many")])],
            "INVALID_ARGUMENT",
        ),
        (  # over the gateway's max_message_bytes (8 MiB) in all, each message within limits
            [pb.PushRequest(queue="bounded", messages=[text("x" * 60_000)])] * 150,
            "RESOURCE_EXHAUSTED",
        ),
    ],
    ids=["empty", "too many pushes", "too many messages", "too many bytes"],
)
async def test_an_oversized_push_many_is_refused_as_a_whole(
    gateway: GatewayUnderTest, pushes: list[pb.PushRequest], code: str
) -> None:
    await attach(gateway, "bounded")
    error = await refused(push_many(gateway, *pushes))
    assert error.code().name == code
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="bounded"), metadata=AUTH)
    assert info.last_id == 0  # nothing was stored


async def test_push_many_can_stop_a_queue_at_its_first_failure_for_ordered_senders(
    gateway: GatewayUnderTest,
) -> None:
    await attach(gateway, "capped", max_backlog=1)
    await attach(gateway, "other")
    pushes = [
        pb.PushRequest(queue="capped", messages=[text("a")]),
        pb.PushRequest(queue="capped", messages=[text("b")]),  # full
        pb.PushRequest(queue="other", messages=[text("x")]),
        pb.PushRequest(queue="capped", messages=[text("c")]),
    ]
    response = await gateway.queues.PushMany(
        pb.PushManyRequest(pushes=pushes, stop_queue_at_failure=True), metadata=AUTH
    )
    first, full, other, skipped = response.outcomes
    assert list(first.result.ids) == [1] and list(other.result.ids) == [1]
    reasons = []
    for outcome in (full, skipped):
        info = error_details_pb2.ErrorInfo()
        outcome.error.details[0].Unpack(info)
        reasons.append((outcome.error.code, info.reason, dict(info.metadata)))
    assert reasons == [
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
            "QUEUE_FULL",
            {"queue": "capped", "max_backlog": "1"},
        ),
        (grpc.StatusCode.ABORTED.value[0], "NOT_ATTEMPTED", {"queue": "capped"}),
    ]
    # Without it, every push is attempted (and the third is refused on its own).
    again = await push_many(gateway, *pushes)
    assert [o.error.code for o in again if o.HasField("error")] == [
        grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    ] * 3


async def test_a_push_asks_for_its_durability(gateway: GatewayUnderTest) -> None:
    """The redis_server has no replicas and fsyncs every write (appendfsync always)."""
    await attach(gateway, "durable")

    async def push(durability: str) -> pb.PushResponse:
        request = pb.PushRequest(queue="durable", messages=[text("x")], durability=durability)
        response: pb.PushResponse = await gateway.queues.Push(request, metadata=AUTH)
        return response

    assert list((await push("fsync")).ids) == [1]
    with pytest.raises(grpc.aio.AioRpcError) as short:
        await push("replicas=1")
    assert short.value.code() is grpc.StatusCode.UNAVAILABLE
    info = error_info(short.value)
    assert info.reason == "DURABILITY_NOT_CONFIRMED" and info.metadata["ids"] == "2"
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await push("eventually")
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    info = await gateway.queues.GetQueue(pb.GetQueueRequest(queue="durable"), metadata=AUTH)
    assert info.count == 2  # the unconfirmed push is stored all the same; the bad one is not
