from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from busmq import Bus, InvalidMessageError, InvalidNameError, Mode, Queue
from busmq.channel import Channel, ChannelEndedError, ChannelStateError
from busmq.channel_protocol import ChannelState, channel_queue_name
from busmq.events import Event, Subscription
from busmq.message import Delivery
from tests.support.processes import HelperProcess
from tests.support.waiting import eventually, take

pytestmark = pytest.mark.also_on_uvloop  # the same tests on uvloop's event loop


async def next_event(events: Subscription[Event], kind: str, timeout: float = 10.0) -> Event:
    """The next event of ``kind`` (earlier events of other kinds are skipped)."""
    async with asyncio.timeout(timeout):
        async for event in events:
            if event.kind == kind:
                return event
    raise AssertionError(f"events ended before {kind!r}")


async def queues_exist(bus: Bus, name: str) -> list[bool]:
    return [await Queue(bus, channel_queue_name(name, r)).exists() for r in ("local", "remote")]


# -- two processes ---------------------------------------------------------------------


async def test_peers_in_two_processes_exchange_messages_both_ways_in_order(
    shard_urls: list[str], make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus(shard_urls)
    channel = Channel(bus, "chat")
    events = channel.events.subscribe()
    await channel.connect()
    for i in range(20):  # the peer is not there yet: these wait in its queue
        await channel.send(i)
    peer = await HelperProcess("channel_peer", json.dumps(shard_urls), "chat", "echo").start()
    try:
        await next_event(events, "remote_connected")
        echoes = await take(channel, 20)
        assert [d.data for d in echoes] == [{"echo": i} for i in range(20)]
        got: list[Any] = []
        while len(got) < 20:
            record = await peer.read()
            if "message" in record:
                got.append(record["message"])
        assert got == list(range(20))
        await channel.send("bye")
        await next_event(events, "remote_disconnected")
        assert not channel.remote_connected
        await peer.read_until("event", "done")
        assert await peer.wait() == 0
    finally:
        await peer.stop()
        await channel.disconnect()


async def test_end_reaches_the_peer_process_and_removes_both_queues(
    redis_server: Any, make_bus: Callable[..., Any]
) -> None:
    urls = [redis_server.url]
    bus: Bus = await make_bus(urls)
    peer = await HelperProcess("channel_peer", json.dumps(urls), "ending", "until-ended").start()
    try:
        await peer.read_until("event", "connected")
        channel = Channel(bus, "ending")
        events = channel.events.subscribe()
        await channel.connect()
        await next_event(events, "remote_connected")
        await channel.end()
        assert (await next_event(events, "ended")).details == {"by": "local"}
        assert (await peer.read_until("event", "ended"))["by"] == "remote"
        assert await peer.wait() == 0
        await eventually(lambda: _none_exist(bus, "ending"), timeout=5, what="both queues removed")
        with pytest.raises(ChannelEndedError):
            await channel.send("too late")
    finally:
        await peer.stop()


async def _none_exist(bus: Bus, name: str) -> bool:
    return not any(await queues_exist(bus, name))


async def test_at_least_once_channel_loses_nothing_when_a_peer_is_killed_mid_stream(
    redis_server: Any, make_bus: Callable[..., Any]
) -> None:
    urls = [redis_server.url]
    bus: Bus = await make_bus(urls)
    channel = Channel(bus, "sturdy")
    await channel.connect()
    total = 300
    for n in range(total):
        await channel.send({"n": n})
    first = await HelperProcess("channel_peer", json.dumps(urls), "sturdy", "slow-sink").start()
    second = HelperProcess("channel_peer", json.dumps(urls), "sturdy", "slow-sink")
    try:
        seen: set[int] = set()
        while len(seen) < 40:
            record = await first.read()
            if "got" in record:
                seen.add(record["got"])
        first.kill()
        await first.wait()
        await second.start()
        async with asyncio.timeout(20):
            while len(seen) < total:
                record = await second.read()
                if "got" in record:
                    seen.add(record["got"])
        assert seen == set(range(total))
        # The killed peer had deliveries in hand: they came back as redeliveries.
        assert any(r.get("redelivered") for r in second.records)
    finally:
        await first.stop()
        await second.stop()
        await channel.disconnect()


# -- one process, two ends ---------------------------------------------------------------


async def test_connect_and_disconnect_fire_local_and_remote_events(bus: Bus) -> None:
    a, b = Channel(bus, "events"), Channel(bus, "events")
    a_events, b_events = a.events.subscribe(), b.events.subscribe()
    await a.connect()
    assert (await next_event(a_events, "connected")).details["role"] == "local"
    await b.listen()
    assert (b.role, b.peer_role) == ("remote", "local")
    await next_event(b_events, "connected")
    await next_event(b_events, "remote_connected")
    await next_event(a_events, "remote_connected")
    assert a.remote_connected and b.remote_connected
    await b.disconnect()
    await next_event(b_events, "disconnected")
    await next_event(a_events, "remote_disconnected")
    assert b.state is ChannelState.DISCONNECTED
    await a.disconnect()


async def test_a_message_sent_before_the_peer_connected_is_delivered(bus: Bus) -> None:
    a = Channel(bus, "early", local="client", remote="server")
    await a.connect()
    await a.send("first")
    await Channel(bus, "early", local="client", remote="server").send_to("server", "second")
    b = Channel(bus, "early", local="client", remote="server")
    await b.listen()
    assert [d.data for d in await take(b, 2)] == ["first", "second"]
    await b.send({"answer": 42}, headers={"trace": "t1"})
    (reply,) = await take(a, 1)
    assert reply.data == {"answer": 42}
    assert reply.headers == {"trace": "t1"}
    await asyncio.gather(a.disconnect(), b.disconnect())


async def test_a_handler_receives_messages_in_order_with_message_events(bus: Bus) -> None:
    a, b = Channel(bus, "handled"), Channel(bus, "handled")
    received: list[Any] = []
    notified: list[Any] = []
    b.events.on(
        lambda e: notified.append(e.details["delivery"].data) if e.kind == "message" else None
    )

    async def handle(delivery: Delivery) -> None:
        received.append(delivery.data)

    await b.listen(handler=handle)
    await a.connect()
    for i in range(50):
        await a.send(i)
    await eventually(lambda: len(received) == 50, what="50 messages handled")
    assert received == notified == list(range(50))
    await asyncio.gather(a.disconnect(), b.disconnect())


async def test_at_least_once_deliveries_unacked_at_disconnect_come_back(bus: Bus) -> None:
    a, b = Channel(bus, "acks"), Channel(bus, "acks")
    await a.connect()
    for i in range(10):
        await a.send(i)
    await b.listen(Mode.AT_LEAST_ONCE, prefetch=4, visibility_timeout=0.5)
    first = await take(b, 3)
    await first[0].ack()
    await b.ack(first[1].id)
    # Data 2 stays unacked (back after the visibility timeout); the rest were fetched
    # but not handed out, and come back at once.
    await b.disconnect()
    again = Channel(bus, "acks")
    # The claiming end's visibility timeout decides when data 2 is taken over.
    await again.listen(Mode.AT_LEAST_ONCE, visibility_timeout=0.5)
    rest = await take(again, 8)
    assert sorted(d.data for d in rest) == list(range(2, 10))
    for delivery in rest:
        await delivery.ack()
    await asyncio.gather(a.disconnect(), again.disconnect())


async def test_the_peer_ending_ends_this_end_too(bus: Bus) -> None:
    a, b = Channel(bus, "mutual"), Channel(bus, "mutual")
    b_events = b.events.subscribe()
    await a.connect()
    await b.listen()
    await a.send("last words")
    await a.end()
    assert (await next_event(b_events, "ended")).details == {"by": "remote"}
    assert b.state is ChannelState.ENDED
    assert [d.data for d in await take(b, 1)] == ["last words"]
    assert await queues_exist(bus, "mutual") == [False, False]
    with pytest.raises(ChannelEndedError):
        await b.send("anyone?")
    with pytest.raises(ChannelEndedError):
        await b.listen()


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "roles"),
    [
        ("bad name", {}),
        ("", {}),
        ("{tag}", {}),
        ("x" * 197, {}),  # fine as a queue name, too long with ":to:remote"
        ("ok", {"local": "a:b"}),
        ("ok", {"remote": ""}),
        ("ok", {"local": "same", "remote": "same"}),
    ],
)
async def test_invalid_names_and_roles_are_refused(
    redis_server: Any, make_bus: Callable[..., Any], name: str, roles: dict[str, Any]
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    with pytest.raises(InvalidNameError):
        Channel(bus, name, **roles)


async def test_bad_sends_get_clear_errors(redis_server: Any, make_bus: Callable[..., Any]) -> None:
    bus: Bus = await make_bus([redis_server.url])
    channel = Channel(bus, "strict")
    with pytest.raises(ChannelStateError, match="not connected"):
        await channel.send("hello")
    with pytest.raises(InvalidNameError):
        await channel.send_to("stranger", "hello")
    async with channel:
        await channel.connect()
        with pytest.raises(ChannelStateError, match="already connected"):
            await channel.listen()
        with pytest.raises(InvalidMessageError):
            await channel.send({"not": {1, 2}})
        with pytest.raises(InvalidMessageError, match="reserved"):
            await channel.send("x", headers={"busmq-control": "end"})
    await channel.end()
    with pytest.raises(ChannelEndedError):
        await channel.send("hello")
    with pytest.raises(ChannelEndedError):
        await channel.send_to("remote", "hello")
    with pytest.raises(ChannelEndedError):
        await channel.connect()


async def test_a_channel_end_rejects_to_its_queues_dead_letters(bus: Bus) -> None:
    a, b = Channel(bus, "rejects"), Channel(bus, "rejects")
    await a.connect()
    await a.send({"order": 1})
    await a.send({"order": 2})
    await b.listen(Mode.AT_LEAST_ONCE)
    bad, good = await take(b, 2)
    await bad.reject("unknown order schema")
    await good.nack(delay=0.2)
    [again] = await take(b, 1)
    assert (again.data, again.delivery_count) == ({"order": 2}, 2)
    await again.ack()
    inbound = bus.queue(channel_queue_name("rejects", "remote"))  # the listening end's
    info = await inbound.info()
    assert (info.count, info.dead_letters) == (0, 1)
    async with inbound.dead_letters() as dead, dead.consume(Mode.AT_MOST_ONCE) as reader:
        letter = await anext(reader)
    assert letter.data == {"order": 1}
    assert letter.headers["busmq-dead-reason"] == "rejected"
    await asyncio.gather(a.disconnect(), b.disconnect())
