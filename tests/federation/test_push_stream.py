"""Direct pushes of a link go over one ``PushStream``: one call for a thousand pushes,
each with its own ids or error, per-task order kept; the outbox takes over at a cut
with nothing lost or stored twice; a gateway without ``PushStream`` gets calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from busmq import Bus
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
