"""Direct pushes of a link to a gateway without ``PushStream`` are coalesced into
PushMany calls while calls are under way: far fewer calls, each push with its own ids
or its own error, per-task order kept, and the outbox taking over at a cut with nothing
lost or stored twice. (``test_push_stream.py`` has the pushes over a stream.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from busmq import Bus, Mode, QueueFullError, QueueNotFoundError
from busmq.federation import FederatedQueue, FederationTarget
from busmq.federation.push_stream import StreamedPushes, StreamUnsupported
from busmq.federation.pushes import FULL_MESSAGES
from busmq.v1 import queue_service_pb2 as pb
from busmq_gateway import Gateway, GatewaySettings
from busmq_gateway.queue_service import QueueService
from tests.conftest import fast_settings
from tests.federation.conftest import SECRET, CallCounter, DatacenterA, MakeB
from tests.support.gateway_process import running_gateway
from tests.support.waiting import eventually

QUEUES = [f"coalesced-{i}" for i in range(5)]


@pytest.fixture(autouse=True)
def pushes_by_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every push answered as by a gateway without ``PushStream``: by calls."""

    async def unsupported(self: StreamedPushes, request: pb.PushRequest) -> pb.PushResponse:
        raise StreamUnsupported()

    monkeypatch.setattr(StreamedPushes, "push", unsupported)


async def federated(dc_a: DatacenterA, bus: Bus, names: list[str]) -> list[FederatedQueue]:
    for name in names:
        await dc_a.bus.queue(name).attach(ttl=120)
    remotes = [bus.federate(name, dc_a.url) for name in names]
    assert await remotes[0].link.wait_usable(10)
    return remotes


async def stored(bus: Bus, name: str, count: int) -> list[tuple[int, bytes]]:
    """(id, payload) of the first ``count`` messages of ``name``, in queue order."""
    got: list[tuple[int, bytes]] = []
    if count:
        async with bus.queue(name).consume(Mode.AT_MOST_ONCE, max=count) as consumer:
            async for delivery in consumer:
                got.append((delivery.id, delivery.payload))
    return got


async def push_in_turn(
    queue: FederatedQueue, task: int, count: int, results: dict[bytes, int | None]
) -> None:
    """``count`` pushes one after the other, as one producer task would make them."""
    for i in range(count):
        payload = b"%d-%d" % (task, i)
        results[payload] = await queue.push(payload)


def in_task_order(messages: list[tuple[int, bytes]]) -> bool:
    """Whether each task's messages are in the order the task pushed them."""
    last: dict[bytes, int] = {}
    for _, payload in messages:
        task, index = payload.split(b"-")
        if int(index) <= last.get(task, -1):
            return False
        last[task] = int(index)
    return True


async def thousand_concurrent_pushes(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> list[FederatedQueue]:
    """100 producer tasks, 20 per queue, 10 pushes each: 1,000 pushes, 100 at a time,
    the calls counted. Every push went direct, each caller got the id its message was
    stored with, each queue's ids without gaps, each task's pushes in order."""
    remotes = await federated(dc_a, dc_b, QUEUES)
    call_counter.install(remotes[0].link)
    results: dict[bytes, int | None] = {}
    await asyncio.gather(
        *(push_in_turn(remotes[task % 5], task, 10, results) for task in range(100))
    )
    assert None not in results.values()  # every push went direct: none to the outbox
    for index, name in enumerate(QUEUES):
        messages = await stored(dc_a.bus, name, 200)
        assert [i for i, _ in messages] == list(range(1, 201))
        assert all(results[payload] == i for i, payload in messages)
        assert {int(p.split(b"-")[0]) % 5 for _, p in messages} == {index}
        assert in_task_order(messages)
    assert sum(r.pushed for r in remotes) == 1000
    return remotes


async def pushes_with_their_own_outcomes(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> list[FederatedQueue]:
    """35 concurrent pushes to a present, an absent and a capped queue (5 messages at
    most), the calls counted: each push's own id or error, nothing to the outbox."""
    await dc_a.bus.queue("capped").attach(ttl=120, max_backlog=5)
    present, capped = await federated(dc_a, dc_b, ["present", "capped"])
    absent = dc_b.federate("absent", dc_a.url)
    call_counter.install(present.link)
    pushes = [present.push(b"p%d" % i) for i in range(20)]
    pushes += [absent.push(b"a%d" % i) for i in range(5)]
    pushes += [capped.push(b"c%d" % i) for i in range(10)]
    outcomes = await asyncio.gather(*pushes, return_exceptions=True)
    assert sorted(o for o in outcomes[:20] if isinstance(o, int)) == list(range(1, 21))
    for error in outcomes[20:25]:
        assert isinstance(error, QueueNotFoundError) and error.queue == "absent"
    capped_ids = [o for o in outcomes[25:] if isinstance(o, int)]
    full = [o for o in outcomes[25:] if isinstance(o, QueueFullError)]
    assert sorted(capped_ids) == [1, 2, 3, 4, 5] and len(full) == 5
    assert all(e.queue == "capped" and e.limit == 5 for e in full)
    assert present.outbox_depth == capped.outbox_depth == absent.outbox_depth == 0
    return [present, capped, absent]


async def test_a_thousand_concurrent_pushes_take_far_fewer_calls_and_keep_ids_and_order(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    await thousand_concurrent_pushes(dc_a, dc_b, call_counter)
    calls = call_counter.calls
    assert calls["PushMany"] > 0
    assert calls["Push"] + calls["PushMany"] < 250, calls
    for name in QUEUES:
        assert await dc_a.bus.queue(name).count() == 0


async def test_each_push_of_a_coalesced_call_gets_its_own_result_or_error(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    await pushes_with_their_own_outcomes(dc_a, dc_b, call_counter)
    assert call_counter.calls["PushMany"] > 0


async def push_across_a_cut(dc_a: DatacenterA, remotes: list[FederatedQueue]) -> None:
    """1,000 pushes by 50 producer tasks while the link is cut and restored: some go
    direct, some through the outbox; in the end each is stored once, every queue's ids
    without gaps, each task's pushes in order, each direct push under its own id."""
    link = remotes[0].link
    results: dict[bytes, int | None] = {}
    producers = asyncio.gather(
        *(push_in_turn(remotes[task % 5], task, 20, results) for task in range(50))
    )
    await eventually(lambda: len(results) >= 200, what="pushes under way")
    await dc_a.proxy.cut()
    await eventually(lambda: not link.usable, what="the cut noticed")
    await eventually(lambda: link.outbox_depth > 0, what="pushes queued in the outbox")
    await dc_a.proxy.restore()
    await producers
    await eventually(lambda: link.outbox_depth == 0, timeout=30, what="outbox drained")
    direct = [p for p, i in results.items() if i is not None]
    assert direct and len(direct) < 1000  # some went direct, some through the outbox
    everything: list[bytes] = []
    for name in QUEUES:
        count = await dc_a.bus.queue(name).last_id()
        messages = await stored(dc_a.bus, name, count)
        assert [i for i, _ in messages] == list(range(1, count + 1))
        assert in_task_order(messages)
        assert all(results[p] in (None, i) for i, p in messages)
        everything += [p for _, p in messages]
    assert len(everything) == 1000 and set(everything) == set(results)  # once each


async def test_a_cut_during_coalesced_pushes_sends_them_to_the_outbox_losing_nothing(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    remotes = await federated(dc_a, dc_b, QUEUES)
    call_counter.install(remotes[0].link)
    await push_across_a_cut(dc_a, remotes)
    calls = call_counter.calls
    assert calls["PushMany"] > 0
    assert calls["Push"] + calls["PushMany"] < 250, calls  # direct and forwarded alike


async def test_a_push_whose_caller_gives_up_while_it_waits_is_never_sent(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    (remote,) = await federated(dc_a, dc_b, ["patient"])
    pushes = remote.link.pushes
    call_counter.install(remote.link)
    call_counter.held.clear()  # the first call stays under way
    under_way = asyncio.create_task(remote.push(b"under way"))
    given_up = asyncio.create_task(remote.push(b"given up"))
    await eventually(lambda: pushes.waiting == 1, what="a push waiting")
    given_up.cancel()
    await asyncio.gather(given_up, return_exceptions=True)
    call_counter.held.set()
    assert await under_way == 1
    assert await remote.push(b"next") == 2
    assert given_up.cancelled() and pushes.waiting == 0
    assert call_counter.calls == {"Push": 2}
    assert await stored(dc_a.bus, "patient", 2) == [(1, b"under way"), (2, b"next")]


async def test_waiting_pushes_that_fill_a_call_go_while_another_is_under_way(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    (remote,) = await federated(dc_a, dc_b, ["batches"])
    assert remote.link.pushes.max_in_flight >= 2
    call_counter.install(remote.link)
    call_counter.held.clear()
    small = asyncio.create_task(remote.push(b"small"))  # under way, held
    large = asyncio.create_task(remote.push_batch([b"%d" % i for i in range(FULL_MESSAGES)]))
    await eventually(lambda: call_counter.calls["Push"] == 2, what="the full push sent")
    call_counter.held.set()
    assert sorted([await small, *(await large or [])]) == list(range(1, FULL_MESSAGES + 2))


async def test_the_outbox_forwards_a_queue_in_push_many_calls_in_order_past_a_full_queue(
    dc_a: DatacenterA, dc_b: Bus, call_counter: CallCounter
) -> None:
    await dc_a.bus.queue("capped").attach(ttl=120, max_backlog=3)
    (remote,) = await federated(dc_a, dc_b, ["capped"])
    call_counter.install(remote.link)
    await dc_a.proxy.cut()
    await eventually(lambda: not remote.link.usable, what="the cut noticed")
    for i in range(6):
        assert await remote.push(b"%d" % i) is None
    await dc_a.proxy.restore()

    async def room_used() -> bool:
        return await dc_a.bus.queue("capped").count() == 3

    await eventually(room_used, what="the first rows forwarded")
    first = await stored(dc_a.bus, "capped", 3)  # makes room: the rest follows, in order
    await eventually(lambda: remote.outbox_depth == 0, what="outbox drained")
    messages = first + await stored(dc_a.bus, "capped", 3)
    assert messages == [(i + 1, b"%d" % i) for i in range(6)]
    assert call_counter.calls["PushMany"] >= 2 and call_counter.calls["Push"] == 0


@contextlib.asynccontextmanager
async def gateway_on(dc_a: DatacenterA) -> AsyncIterator[Gateway]:
    """An in-process gateway on A's Redis (for a test that changes a servicer first)."""
    settings = GatewaySettings(
        listen="127.0.0.1:0", secrets=(SECRET,), bus=fast_settings([dc_a.redis.url])
    )
    async with running_gateway(settings) as gateway:
        yield gateway


@pytest.fixture
async def gateway_without_push_many(
    dc_a: DatacenterA, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    """A gateway that answers PushMany as one built before it existed does
    (``UNIMPLEMENTED``)."""

    async def unimplemented(
        self: QueueService, request: pb.PushManyRequest, context: grpc.aio.ServicerContext
    ) -> pb.PushManyResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        raise AssertionError("abort raises")

    monkeypatch.setattr(QueueService, "PushMany", unimplemented)
    async with gateway_on(dc_a) as gateway:
        yield gateway


async def push_to_an_older_gateway(
    dc_a: DatacenterA, make_b: MakeB, gateway: Gateway, call_counter: CallCounter
) -> FederatedQueue:
    """200 pushes by 20 producer tasks through ``gateway``, the calls counted: each
    stored once under the id its caller got, each task's in order."""
    url = f"http://127.0.0.1:{gateway.port}"
    bus = await make_b(target=FederationTarget(url, secret=SECRET))
    await dc_a.bus.queue("old-gateway").attach(ttl=120)
    remote = bus.federate("old-gateway", url)
    assert await remote.link.wait_usable(10)
    call_counter.install(remote.link)
    results: dict[bytes, int | None] = {}
    await asyncio.gather(*(push_in_turn(remote, task, 10, results) for task in range(20)))
    messages = await stored(dc_a.bus, "old-gateway", 200)
    assert [i for i, _ in messages] == list(range(1, 201)) and in_task_order(messages)
    assert all(results[p] == i for i, p in messages)
    return remote


async def test_a_gateway_without_push_many_gets_single_pushes_from_then_on(
    dc_a: DatacenterA,
    make_b: MakeB,
    gateway_without_push_many: Gateway,
    call_counter: CallCounter,
) -> None:
    remote = await push_to_an_older_gateway(dc_a, make_b, gateway_without_push_many, call_counter)
    assert call_counter.calls["PushMany"] == 1  # tried once, then remembered
    assert not remote.link.pushes.push_many
    assert call_counter.calls["Push"] >= 200
