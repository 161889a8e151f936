"""Direct pushes of a link go over one ``PushStream``: one call for a thousand pushes,
each with its own ids or error, per-task order kept; the outbox takes over at a cut
with nothing lost or stored twice; a gateway without ``PushStream`` gets calls; a push is
on the stream in its caller's own turn of the event loop."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from busmq import Bus
from busmq.federation.push_stream import StreamedPushes
from busmq.v1 import queue_service_pb2 as pb
from busmq_gateway import Gateway
from busmq_gateway.queue_service import QueueService
from tests.federation.conftest import CallCounter, DatacenterA, MakeB
from tests.federation.test_push_coalescing import (
    QUEUES,
    federated,
    gateway_on,
    push_across_a_cut,
    push_to_an_older_gateway,
    pushes_with_their_own_outcomes,
    thousand_concurrent_pushes,
)
from tests.support.waiting import eventually


async def test_a_thousand_concurrent_pushes_go_over_one_stream_keeping_ids_and_order(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    await thousand_concurrent_pushes(dc_a, dc_b, call_counter)
    assert call_counter.calls == {"PushStream": 1}


async def test_each_push_over_the_stream_gets_its_own_result_or_error(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    await pushes_with_their_own_outcomes(dc_a, dc_b, call_counter)
    assert call_counter.calls == {"PushStream": 1}


async def test_a_cut_during_streamed_pushes_sends_them_to_the_outbox_losing_nothing(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    remotes = await federated(dc_a, dc_b, QUEUES)
    call_counter.install(remotes[0].link)
    await push_across_a_cut(dc_a, remotes)
    # Direct pushes went over the stream (the outbox forwards by calls).
    assert call_counter.calls["PushStream"] >= 1


async def test_a_push_too_large_for_the_stream_goes_by_a_call(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    (remote,) = await federated(dc_a, dc_b, ["large"])
    call_counter.install(remote.link)
    large = [bytes(600 * 1024), bytes(600 * 1024)]  # over MAX_STREAMED_BYTES together
    small = [remote.push(b"%d" % i) for i in range(20)]
    ids = await asyncio.gather(remote.push_batch(large), *small)
    assert call_counter.calls == {"PushStream": 1, "Push": 1}
    assert sorted([*ids[0], *ids[1:]]) == list(range(1, 23))
    assert remote.outbox_depth == 0


@pytest.fixture
async def gateway_without_push_stream(
    dc_a: DatacenterA, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    """A gateway that answers PushStream as one built before it existed does
    (``UNIMPLEMENTED``)."""

    async def unimplemented(
        self: QueueService, requests: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield  # pragma: no cover - abort raises

    monkeypatch.setattr(QueueService, "PushStream", unimplemented)
    async with gateway_on(dc_a) as gateway:
        yield gateway


async def test_a_gateway_without_push_stream_gets_calls_from_then_on(
    dc_a: DatacenterA,
    make_b: MakeB,
    gateway_without_push_stream: Gateway,
    call_counter: CallCounter,
) -> None:
    remote = await push_to_an_older_gateway(dc_a, make_b, gateway_without_push_stream, call_counter)
    assert call_counter.calls["PushStream"] == 1  # tried once, then remembered
    assert not remote.link.pushes.streamed.available
    assert call_counter.calls["Push"] + call_counter.calls["PushMany"] >= 1


class _RecordingCall:
    """A ``PushStream`` call that records when each request is written and answers
    each push when the test says."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.answers: asyncio.Queue[pb.PushStreamResponse] = asyncio.Queue()

    async def initial_metadata(self) -> tuple[()]:
        return ()

    async def write(self, request: pb.PushStreamRequest) -> None:
        self.written.append(request.sequence)  # handed to grpc here, completed later
        await asyncio.sleep(0)

    def done(self) -> bool:
        return False

    def cancel(self) -> None:
        pass

    def __aiter__(self) -> AsyncIterator[pb.PushStreamResponse]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[pb.PushStreamResponse]:
        while True:
            yield await self.answers.get()

    def answer(self, sequence: int) -> None:
        outcome = pb.PushStreamOutcome(sequence=sequence, result=pb.PushResponse(ids=[sequence]))
        self.answers.put_nowait(pb.PushStreamResponse(outcomes=[outcome]))


class _Link:
    url = current_url = "http://gateway"
    metadata = ()
    operation_timeout = 5.0

    def __init__(self, call: _RecordingCall) -> None:
        self.call = call

    def stub(self, kind: object = None) -> Any:
        return SimpleNamespace(PushStream=lambda metadata: self.call)

    def report(self, error: object) -> None:
        raise AssertionError(f"no call fails here: {error}")

    def report_code(self, code: object) -> None:
        raise AssertionError(f"no call fails here: {code}")


def _pushes(call: _RecordingCall) -> StreamedPushes:
    return StreamedPushes(_Link(call), lambda r, s: AssertionError(s), lambda r, e: e)  # type: ignore[arg-type]


async def test_pushes_are_written_in_order_by_a_writer_there_only_while_they_wait() -> None:
    """The writer ends once nothing waits, and the next push starts another: pushes made
    during a write follow it in the order made, and none is left unwritten."""
    call = _RecordingCall()
    pushes = _pushes(call)
    for sequence in (1, 2):
        waiting = asyncio.create_task(pushes.push(pb.PushRequest(queue="q")))
        await eventually(lambda s=sequence: call.written[-1:] == [s], what="the push is written")
        call.answer(sequence)
        assert (await waiting).ids == [sequence]
    burst = [asyncio.create_task(pushes.push(pb.PushRequest(queue="q"))) for _ in range(3)]
    await eventually(lambda: len(call.written) == 5, what="the burst is written")
    for sequence in (3, 4, 5):
        call.answer(sequence)
    assert [list((await t).ids) for t in burst] == [[3], [4], [5]]
    assert call.written == [1, 2, 3, 4, 5]
    await pushes.close()


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks came with Python 3.12")
async def test_a_push_is_written_on_the_stream_in_its_callers_own_turn() -> None:
    """A push made while nothing is being written starts the writer eagerly: the push is
    handed to grpc before its caller waits, not a turn of the event loop later behind
    whatever else is ready."""
    call = _RecordingCall()
    pushes = _pushes(call)
    for sequence in (1, 2):
        waiting = asyncio.create_task(pushes.push(pb.PushRequest(queue="q")))
        await asyncio.sleep(0)  # the push's first turn, and no other
        assert call.written[-1:] == [sequence]
        call.answer(sequence)
        assert (await waiting).ids == [sequence]
    await pushes.close()
