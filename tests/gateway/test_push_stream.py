"""``PushStream``: pushes over one bidirectional stream, each answered by its sequence,
stored in order per queue, failing alone, bounded in flight, refused per request, and
answered before a drain ends the stream."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2

from busmq import Bus, PushResult
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import types_pb2
from busmq_gateway.access import Refused
from busmq_gateway.errors import RequestError
from busmq_gateway.push_stream import PushStreamSession
from tests.gateway.conftest import AUTH, GatewayUnderTest, error_info
from tests.gateway.test_principals import WRITER, auth, refused, scoped  # noqa: F401

Outcomes = dict[int, pb.PushStreamOutcome]


def push(sequence: int, queue: str, payload: bytes, **fields: Any) -> pb.PushStreamRequest:
    message = types_pb2.OutgoingMessage(payload=payload, **fields.pop("message", {}))
    return pb.PushStreamRequest(
        sequence=sequence, push=pb.PushRequest(queue=queue, messages=[message], **fields)
    )


async def outcomes_of(call: Any, count: int) -> Outcomes:
    """Read responses until ``count`` pushes are answered; each answered once."""
    answered: Outcomes = {}
    async for response in call:
        for outcome in response.outcomes:
            assert outcome.sequence not in answered, outcome.sequence
            answered[outcome.sequence] = outcome
        if len(answered) == count:
            return answered
    raise AssertionError(f"the stream ended after {len(answered)} of {count} outcomes")


async def stored_payloads(gateway: GatewayUnderTest, queue: str, count: int) -> list[bytes]:
    request = pb.BrowseQueueRequest(queue=queue, from_id=1, to_id=count)
    return [
        message.payload
        async for r in gateway.queues.BrowseQueue(request, metadata=AUTH)
        for message in r.messages.messages
    ]


async def test_pushes_are_answered_by_sequence_and_stored_in_order_per_queue(
    gateway: GatewayUnderTest,
) -> None:
    queues = [f"ps-{i}" for i in range(5)]
    for name in queues:
        await gateway.queues.AttachQueue(pb.AttachQueueRequest(queue=name), metadata=AUTH)
    requests = [push(s, queues[s % 5], b"%d" % s) for s in range(3000)]
    call = gateway.queues.PushStream(iter(requests), metadata=AUTH)
    answered = await outcomes_of(call, len(requests))
    assert await call.code() is grpc.StatusCode.OK  # the client's end of writing ends it

    for index, name in enumerate(queues):
        sequences = range(index, 3000, 5)
        ids = [answered[s].result.ids[0] for s in sequences]
        assert ids == list(range(1, 601)), name  # in the order sent, none twice
        payloads = await stored_payloads(gateway, name, 600)
        assert payloads == [b"%d" % s for s in sequences]


async def test_a_failing_push_is_answered_with_its_error_and_the_stream_goes_on(
    gateway: GatewayUnderTest,
) -> None:
    await gateway.queues.AttachQueue(pb.AttachQueueRequest(queue="ps-fail"), metadata=AUTH)
    not_json = {"message": {"kind": types_pb2.PAYLOAD_KIND_JSON}}
    requests = [
        push(1, "ps-fail", b"first", request_id="r-1"),
        push(2, "ps-fail", b"{not json", **not_json),
        push(3, "ps-fail", b"again", request_id="r-1"),  # a retry of 1: stored once
        push(4, "ps-fail", b"last"),
    ]
    call = gateway.queues.PushStream(iter(requests), metadata=AUTH)
    answered = await outcomes_of(call, 4)
    assert list(answered[1].result.ids) == [1]
    error = answered[2].error
    assert error.code == code_pb2.INVALID_ARGUMENT
    info = error_details_pb2.ErrorInfo()
    error.details[0].Unpack(info)
    assert info.reason == "INVALID_MESSAGE"
    assert answered[3].result.duplicate and list(answered[3].result.ids) == [1]
    assert list(answered[4].result.ids) == [2]
    assert await stored_payloads(gateway, "ps-fail", 2) == [b"first", b"last"]


async def test_a_request_that_does_not_parse_ends_the_stream_invalid_argument(
    gateway: GatewayUnderTest,
) -> None:
    await gateway.queues.AttachQueue(pb.AttachQueueRequest(queue="ps-bad"), metadata=AUTH)
    raw = gateway.channel.stream_stream("/busmq.v1.QueueService/PushStream")
    call = raw(metadata=AUTH)
    await call.write(push(1, "ps-bad", b"ok").SerializeToString())
    first = pb.PushStreamResponse.FromString(await call.read())
    assert list(first.outcomes[0].result.ids) == [1]
    await call.write(b"\xff\xff\xff\xff")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "MALFORMED_REQUEST"
    # Still serving.
    pushed = await gateway.queues.Push(
        pb.PushRequest(queue="ps-bad", messages=[types_pb2.OutgoingMessage(payload=b"x")]),
        metadata=AUTH,
    )
    assert list(pushed.ids) == [2]


async def test_a_drain_ends_an_open_stream_unavailable_draining(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    await gateway.queues.AttachQueue(pb.AttachQueueRequest(queue="ps-drain"), metadata=AUTH)
    call = gateway.queues.PushStream(metadata=AUTH)
    answered: Outcomes = {}
    all_answered = asyncio.Event()

    async def read_all() -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for response in call:
                answered.update((o.sequence, o) for o in response.outcomes)
                if len(answered) == 200:
                    all_answered.set()
        return caught.value

    reader = asyncio.create_task(read_all())
    for sequence in range(1, 201):
        await call.write(push(sequence, "ps-drain", b"%d" % sequence))
    await asyncio.wait_for(all_answered.wait(), 10)
    # The stream is open with nothing under way: the drain ends it.
    await gateway.gateway.stop()
    ended = await reader
    assert ended.code() is grpc.StatusCode.UNAVAILABLE
    assert error_info(ended).reason == "DRAINING"
    assert all(o.HasField("result") for o in answered.values())
    assert (await peer_bus.queue("ps-drain").info()).count == 200


async def test_a_principal_is_checked_per_push(
    scoped: tuple[Any, Any],  # noqa: F811
) -> None:
    _, queues = scoped
    writer = auth(WRITER)
    await queues.AttachQueue(pb.AttachQueueRequest(queue="orders.eu"), metadata=writer)
    requests = [push(1, "orders.eu", b"a"), push(2, "billing.x", b"b"), push(3, "orders.eu", b"c")]
    answered = await outcomes_of(queues.PushStream(iter(requests), metadata=writer), 3)
    assert [list(answered[s].result.ids) for s in (1, 3)] == [[1], [2]]
    assert answered[2].error.code == code_pb2.PERMISSION_DENIED
    info = error_details_pb2.ErrorInfo()
    answered[2].error.details[0].Unpack(info)
    assert dict(info.metadata)["name"] == "billing.x"
    # An unauthenticated stream ends at once.
    denied = await refused(queues.PushStream(metadata=auth("no")).read())
    assert denied.code() is grpc.StatusCode.UNAUTHENTICATED


# -- the session alone (pure logic, no server) -------------------------------------------


async def test_at_most_max_in_flight_pushes_are_read_before_answers() -> None:
    release = asyncio.Event()
    read = 0

    async def slow_push(request: pb.PushRequest) -> PushResult:
        await release.wait()
        return PushResult(ids=[1], duplicate=False)

    async def requests() -> AsyncIterator[Any]:
        nonlocal read
        for sequence in range(25):
            read += 1
            yield push(sequence, f"q{sequence}", b"x")
        read += 1
        yield Refused(push(99, "q", b"x"), RequestError("no"))

    session = PushStreamSession(slow_push, asyncio.Event(), max_in_flight=10)
    responses = session.responses(requests())
    first = asyncio.ensure_future(anext(responses))
    for _ in range(50):
        await asyncio.sleep(0)  # turns of the loop: the session reads all it may
    assert read == 10 and not first.done()  # ten under way, the eleventh not read
    release.set()
    answered = set()
    answered.update(o.sequence for o in (await first).outcomes)
    async for response in responses:
        answered.update(o.sequence for o in response.outcomes)
    assert answered == {*range(25), 99}


async def test_the_session_ends_draining_without_dropping_a_push_it_read() -> None:
    draining = asyncio.Event()
    stored: list[int] = []

    async def store(request: pb.PushRequest) -> PushResult:
        await asyncio.sleep(0.001)  # a store's time, so that pushes are in flight
        stored.append(int(request.messages[0].payload))
        return PushResult(ids=[len(stored)], duplicate=False)

    async def requests() -> AsyncIterator[Any]:
        for sequence in range(1000):
            if sequence == 300:
                draining.set()
            yield push(sequence, "q", b"%d" % sequence)
            await asyncio.sleep(0)  # one push a turn of the loop

    answered: list[int] = []
    with pytest.raises(RequestError) as caught:
        async for response in PushStreamSession(store, draining).responses(requests()):
            answered += [o.sequence for o in response.outcomes]
    assert caught.value.reason == "DRAINING"
    assert answered == stored == list(range(len(answered)))
    assert 300 <= len(answered) < 1000


async def test_a_client_that_takes_no_answers_holds_at_most_max_in_flight() -> None:
    read = 0

    async def store(request: pb.PushRequest) -> PushResult:
        return PushResult(ids=[1], duplicate=False)

    async def requests() -> AsyncIterator[Any]:
        nonlocal read
        for sequence in range(100):
            read += 1
            yield push(sequence, "q", b"x")

    responses = PushStreamSession(store, asyncio.Event(), max_in_flight=10).responses(requests())
    first = await anext(responses)  # and not taken further: its slots are not back
    for _ in range(50):
        await asyncio.sleep(0)
    assert read == 10
    answered = {o.sequence for o in first.outcomes}
    async for response in responses:
        answered.update(o.sequence for o in response.outcomes)
    assert answered == set(range(100))


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks came with Python 3.12")
async def test_a_push_is_under_way_before_the_next_request_is_read() -> None:
    """A queue's lane starts its push in the reader's own turn of the event loop (an eager
    task): the push is on the shard connection before the next request is read, not a
    turn later behind whatever else the gateway has ready."""
    started: list[bytes] = []
    seen_at_next_read: list[list[bytes]] = []
    release = asyncio.Event()

    async def store(request: pb.PushRequest) -> PushResult:
        started.append(request.messages[0].payload)
        await release.wait()
        return PushResult(ids=[len(started)], duplicate=False)

    async def requests() -> AsyncIterator[Any]:
        for sequence in range(3):
            yield push(sequence, f"q{sequence}", b"%d" % sequence)
            seen_at_next_read.append(list(started))
        release.set()

    answered: set[int] = set()
    async for response in PushStreamSession(store, asyncio.Event()).responses(requests()):
        answered.update(o.sequence for o in response.outcomes)
    assert seen_at_next_read == [[b"0"], [b"0", b"1"], [b"0", b"1", b"2"]]
    assert answered == {0, 1, 2}
