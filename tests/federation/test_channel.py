"""A channel between a peer in DC-A (core bus) and a peer in DC-B (federated end)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from busmq import (
    Bus,
    BusUnavailableError,
    Channel,
    ChannelEndedError,
    ChannelState,
    ChannelStateError,
    Delivery,
    Event,
    InvalidMessageError,
    Mode,
)
from busmq.federation import FederationUnauthorizedError
from busmq.federation.channel import FederatedChannel
from tests.federation.conftest import DatacenterA, MakeB
from tests.support.waiting import eventually


def kinds(events: list[Event]) -> Callable[[], list[str]]:
    return lambda: [e.kind for e in events]


def record(channel: Channel | FederatedChannel) -> list[Event]:
    events: list[Event] = []
    channel.events.on(events.append)
    return events


async def collect(channel: Channel | FederatedChannel, into: list[Delivery], count: int) -> None:
    async for delivery in channel:
        into.append(delivery)
        if len(into) >= count:
            return


async def test_both_directions_with_connect_events(dc_a: DatacenterA, dc_b: Bus) -> None:
    peer_a = dc_a.bus.channel("chat", "a", "b")
    end_b = dc_b.federate(dc_b.channel("chat", "a", "b"), dc_a.url)
    assert isinstance(end_b, FederatedChannel)
    assert await end_b.link.wait_usable(10)
    events_a, events_b = record(peer_a), record(end_b)

    # B sends before A is there: the message waits in A's queue.
    await end_b.listen()
    early = await end_b.send("hello a")
    assert early is not None
    await peer_a.connect()
    await eventually(lambda: end_b.remote_connected, what="B sees A connect")

    late = await end_b.send({"n": 2}, headers={"lang": "json"})
    for i in range(3):
        await peer_a.send(f"to b {i}")

    got_a: list[Delivery] = []
    got_b: list[Delivery] = []
    await asyncio.wait_for(collect(peer_a, got_a, 2), 10)
    await asyncio.wait_for(collect(end_b, got_b, 3), 10)
    assert [d.data for d in got_a] == ["hello a", {"n": 2}]
    assert [d.id for d in got_a] == [early, late]
    assert got_a[1].headers == {"lang": "json"}
    assert [d.data for d in got_b] == ["to b 0", "to b 1", "to b 2"]
    assert peer_a.remote_connected  # A saw B's connect, which came before B's data

    assert "connected" in kinds(events_b)() and "remote_connected" in kinds(events_b)()
    assert any(e.kind == "message" for e in events_b)
    assert "remote_connected" in kinds(events_a)()

    # B leaves: A is told, B's iteration ends.
    await end_b.disconnect()
    assert end_b.state is ChannelState.DISCONNECTED
    await eventually(lambda: "remote_disconnected" in kinds(events_a)(), what="A told")
    assert [d async for d in end_b] == []
    with pytest.raises(ChannelStateError):
        await end_b.send("after disconnect")
    await peer_a.disconnect()


async def test_bad_input_and_state_errors(dc_a: DatacenterA, dc_b: Bus) -> None:
    end_b = dc_b.federate(dc_b.channel("calls", "a", "b"), dc_a.url)
    assert await end_b.link.wait_usable(10)
    with pytest.raises(ChannelStateError):
        await end_b.send("not connected")
    with pytest.raises(ChannelStateError):
        await end_b.__anext__()
    await end_b.connect()
    with pytest.raises(ChannelStateError):
        await end_b.listen()
    with pytest.raises(InvalidMessageError):
        await end_b.send("x", headers={"busmq-control": "end"})
    await end_b.disconnect()
    with pytest.raises(ValueError):
        await end_b.connect(prefetch=0)


async def test_at_least_once_through_a_cut_loses_nothing_and_reannounces(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    total = 300
    peer_a = dc_a.bus.channel("orders", "a", "b")
    end_b = dc_b.federate(dc_b.channel("orders", "a", "b"), dc_a.url)
    assert await end_b.link.wait_usable(10)
    events_a, events_b = record(peer_a), record(end_b)
    got_a: list[Delivery] = []
    got_b: list[Delivery] = []

    async def handle_a(delivery: Delivery) -> None:
        got_a.append(delivery)

    async def handle_b(delivery: Delivery) -> None:
        got_b.append(delivery)

    await peer_a.connect(Mode.AT_LEAST_ONCE, handler=handle_a, visibility_timeout=2)
    await end_b.listen(Mode.AT_LEAST_ONCE, handler=handle_b, visibility_timeout=2)
    await eventually(lambda: end_b.remote_connected and peer_a.remote_connected, what="both")

    queued = 0
    for i in range(total):
        if i == 100:
            await dc_a.proxy.cut()
        if i == 200:
            assert end_b.outbox_depth > 0  # B's sends during the cut wait on disk
            await dc_a.proxy.restore()
        if await end_b.send(i) is None:
            queued += 1
        await peer_a.send(i)  # A's side never breaks: its messages wait for B
    assert queued >= 100

    def firsts(got: list[Delivery]) -> list[int]:
        seen: list[int] = []
        for delivery in got:
            if delivery.data not in seen:
                seen.append(delivery.data)
        return seen

    await eventually(lambda: len(firsts(got_a)) == total, timeout=30, what="all in A")
    await eventually(lambda: len(firsts(got_b)) == total, timeout=30, what="all in B")
    assert firsts(got_a) == list(range(total))  # every message, in send order
    assert firsts(got_b) == list(range(total))
    # The outbox forwarded with the same request ids: each message stored once.
    assert len({d.id for d in got_a}) == total
    assert end_b.reconnects >= 1
    resumed = [e for e in events_b if e.kind == "connected" and e.details.get("resumed")]
    assert resumed
    # The peer saw B's end go and come back: the connection was re-announced.
    seen_a = kinds(events_a)()
    assert "remote_disconnected" in seen_a
    assert seen_a.index("remote_connected") < seen_a.index("remote_disconnected")
    assert seen_a[seen_a.index("remote_disconnected") :].count("remote_connected") >= 1
    await end_b.disconnect()
    await peer_a.disconnect()


async def test_replay_resumes_after_the_last_id_seen(dc_a: DatacenterA, dc_b: Bus) -> None:
    peer_a = dc_a.bus.channel("log", "a", "b")
    end_b = dc_b.federate(dc_b.channel("log", "a", "b"), dc_a.url)
    assert await end_b.link.wait_usable(10)
    await peer_a.connect()
    for i in range(50):
        await peer_a.send(i)
    got: list[Delivery] = []
    await end_b.listen(Mode.REPLAY, from_id=1)
    reader = asyncio.create_task(collect(end_b, got, 100))
    await eventually(lambda: len(got) >= 50, what="first half")
    await dc_a.proxy.cut()
    for i in range(50, 100):
        await peer_a.send(i)
    await dc_a.proxy.restore()
    await asyncio.wait_for(reader, 20)
    ids = [d.id for d in got]
    assert ids == sorted(set(ids))  # no id twice, in order
    assert [d.data for d in got] == list(range(100))
    await end_b.disconnect()
    await peer_a.disconnect()


async def test_end_from_b_ends_both_ends_and_removes_the_queues(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    peer_a = dc_a.bus.channel("session", "a", "b")
    end_b = dc_b.federate(dc_b.channel("session", "a", "b"), dc_a.url)
    assert await end_b.link.wait_usable(10)
    events_a, events_b = record(peer_a), record(end_b)
    await peer_a.connect()
    await end_b.listen()
    await end_b.end()
    assert end_b.state is ChannelState.ENDED
    assert ("ended", "local") in [(e.kind, e.details.get("by")) for e in events_b]
    await eventually(
        lambda: ("ended", "remote") in [(e.kind, e.details.get("by")) for e in events_a],
        what="A ended by B",
    )
    assert peer_a.state is ChannelState.ENDED
    for role in ("a", "b"):
        await eventually(
            lambda role=role: _gone(dc_a.bus, f"session:to:{role}"), what=f"queue {role} gone"
        )
    with pytest.raises(ChannelEndedError):
        await end_b.send("after end")


async def _gone(bus: Bus, name: str) -> bool:
    return not await bus.queue(name).exists()


async def test_peer_end_reaches_the_federated_end(dc_a: DatacenterA, dc_b: Bus) -> None:
    peer_a = dc_a.bus.channel("session2", "a", "b")
    end_b = dc_b.federate(dc_b.channel("session2", "a", "b"), dc_a.url)
    assert await end_b.link.wait_usable(10)
    events_b = record(end_b)
    await peer_a.connect()
    await end_b.listen()
    await peer_a.end()
    await eventually(
        lambda: ("ended", "remote") in [(e.kind, e.details.get("by")) for e in events_b],
        what="B ended by A",
    )
    assert end_b.state is ChannelState.ENDED
    assert [d async for d in end_b] == []


async def test_connect_needs_the_link_and_the_right_secret(
    dc_a: DatacenterA, make_b: MakeB
) -> None:
    wrong = await make_b(secret="not-the-secret")
    end = wrong.federate(wrong.channel("c", "a", "b"), dc_a.url)
    await end.link.wait_settled(5)
    with pytest.raises(FederationUnauthorizedError):
        await end.connect()

    bus = await make_b()
    end = bus.federate(bus.channel("c", "a", "b"), dc_a.url)
    assert await end.link.wait_usable(10)
    await dc_a.proxy.cut()
    await eventually(lambda: not end.link.usable, what="link down")
    with pytest.raises(BusUnavailableError):
        await end.connect()
    with pytest.raises(BusUnavailableError):
        await end.send_to("a", "direct only")
    await dc_a.proxy.restore()
    assert await end.link.wait_usable(10)
    assert await end.send_to("a", "now it goes") == 1
    await end.connect()
    await end.disconnect()
