"""ChannelService through the generated stub: a gRPC end talking to a core end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from busmq import Bus, Channel
from busmq.v1 import channel_service_pb2 as pb
from busmq.v1 import types_pb2
from tests.gateway.conftest import AUTH, GatewayUnderTest, Stream, error_info
from tests.support.waiting import eventually

TEXT = types_pb2.PAYLOAD_KIND_TEXT
ALO = types_pb2.CONSUME_MODE_AT_LEAST_ONCE


def text(value: str, **headers: str) -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=value.encode(), kind=TEXT, headers=headers)


def connect(gw: GatewayUnderTest, **fields: Any) -> Stream[pb.ConnectChannelResponse]:
    return Stream(gw.channels.ConnectChannel(pb.ConnectChannelRequest(**fields), metadata=AUTH))


async def started(stream: Stream[pb.ConnectChannelResponse]) -> pb.ChannelStarted:
    first = await stream.next()
    assert first.HasField("started")
    assert await stream.events(1) == [("state", "connected")]
    return first.started


async def take(channel: Channel, n: int) -> list[Any]:
    """The data of the next n deliveries of a core end."""
    items: list[Any] = []

    async def run() -> None:
        async for delivery in channel:
            items.append(delivery.data)
            if len(items) == n:
                return

    await asyncio.wait_for(run(), 10)
    return items


def recorder(channel: Channel) -> list[str]:
    kinds: list[str] = []
    channel.events.on(lambda event: kinds.append(event.kind) if event.kind != "message" else None)
    return kinds


async def test_a_grpc_end_and_a_core_end_exchange_messages_both_ways_in_order(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    # Sent before either end connected: it waits in the queue of the role "server".
    early = await gateway.channels.SendToRole(
        pb.SendToRoleRequest(channel="chat", role="server", messages=[text("early")]),
        metadata=AUTH,
    )
    assert list(early.ids) == [1]
    stream = connect(gateway, channel="chat", local_role="client", remote_role="server")
    start = await started(stream)
    assert (start.role, start.peer_role) == ("client", "server") and start.connection_id
    server = peer_bus.channel("chat", local="client", remote="server")
    await server.listen()
    assert await stream.events(1) == [("state", "remote_connected")]

    sent = await gateway.channels.SendChannel(
        pb.SendChannelRequest(
            connection_id=start.connection_id, messages=[text(f"c{i}") for i in range(5)]
        ),
        metadata=AUTH,
    )
    assert list(sent.ids) == list(range(sent.ids[0], sent.ids[0] + 5))
    assert await take(server, 6) == ["early", "c0", "c1", "c2", "c3", "c4"]

    for i in range(5):
        await server.send({"s": i}, headers={"n": str(i)})
    first = await stream.next()
    assert dict(first.delivery.message.headers) == {"n": "0"}
    assert json.loads(first.delivery.message.payload) == {"s": 0}
    rest = await stream.events(4)
    assert [json.loads(p) for _, p in rest] == [{"s": i} for i in range(1, 5)]  # type: ignore[arg-type]

    # What the peer sent before disconnecting comes first, then the event.
    await server.send("last")
    await server.disconnect()
    assert await stream.events(2) == [("delivery", b"last"), ("state", "remote_disconnected")]
    # The peer comes back and ends the channel: the gRPC end is told and its stream ends.
    await server.listen()
    await server.end()
    assert await stream.rest() == [("state", "remote_connected"), ("state", "ended")]


async def test_disconnect_then_end_from_grpc_reach_the_core_peer(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    peer = peer_bus.channel("pair")
    peer_events = recorder(peer)
    await peer.connect()  # the core end plays "local"
    stream = connect(gateway, channel="pair", listen=True)
    start = await started(stream)
    assert (start.role, start.peer_role) == ("remote", "local")
    assert await stream.events(1) == [("state", "remote_connected")]
    assert (await stream.raw(5)).HasField("heartbeat")  # an idle stream beats (every 0.5 s here)

    await gateway.channels.DisconnectChannel(
        pb.DisconnectChannelRequest(connection_id=start.connection_id), metadata=AUTH
    )
    assert await stream.rest() == [("state", "disconnected")]
    await eventually(lambda: "remote_disconnected" in peer_events, what="peer told")
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await gateway.channels.SendChannel(
            pb.SendChannelRequest(connection_id=start.connection_id, messages=[text("x")]),
            metadata=AUTH,
        )
    assert gone.value.code() is grpc.StatusCode.NOT_FOUND

    # Messages sent meanwhile wait for the next connection.
    await peer.send("while away")
    again = connect(gateway, channel="pair", listen=True)
    second = await started(again)
    assert await again.events(1) == [("delivery", b"while away")]
    await gateway.channels.EndChannel(
        pb.EndChannelRequest(connection_id=second.connection_id), metadata=AUTH
    )
    assert await again.rest() == [("state", "ended")]
    await eventually(lambda: "ended" in peer_events, what="peer ended")
    for role in ("local", "remote"):
        queue = peer_bus.queue(f"pair:to:{role}")
        await eventually(lambda q=queue: _gone(q), what=f"queue of {role} removed")


async def _gone(queue: Any) -> bool:
    return not await queue.exists()


async def test_at_least_once_acks_and_a_cancelled_stream_gives_back_what_it_did_not_ack(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    peer = peer_bus.channel("jobs")
    for i in range(3):
        await peer.send_to("remote", {"job": i})
    long = duration_pb2.Duration(seconds=300)
    stream = connect(gateway, channel="jobs", listen=True, mode=ALO, visibility_timeout=long)
    await started(stream)
    first = [(await stream.next()).delivery for _ in range(3)]
    assert [json.loads(d.message.payload)["job"] for d in first] == [0, 1, 2]
    acked = await gateway.channels.AckChannel(
        pb.AckChannelRequest(channel="jobs", role="remote", ids=[first[0].message.id, 999]),
        metadata=AUTH,
    )
    assert acked.acked == 1 and list(acked.unknown_ids) == [999]
    stream.cancel()

    # Well before the 300 s visibility timeout, the next connection gets the two unacked
    # deliveries again, marked as redelivered.
    again = connect(gateway, channel="jobs", listen=True, mode=ALO, visibility_timeout=long)
    await started(again)
    second = [(await again.next()).delivery for _ in range(2)]
    assert sorted(d.message.id for d in second) == [first[1].message.id, first[2].message.id]
    assert [d.delivery_count for d in second] == [2, 2]
    again.cancel()


async def test_bad_sends_and_acks_are_refused(gateway: GatewayUnderTest) -> None:
    stream = connect(gateway, channel="strict")
    start = await started(stream)
    cases: list[tuple[Any, Any, grpc.StatusCode, str]] = [
        (
            gateway.channels.SendChannel,
            pb.SendChannelRequest(connection_id="nope", messages=[text("x")]),
            grpc.StatusCode.NOT_FOUND,
            "CONNECTION_NOT_FOUND",
        ),
        (
            gateway.channels.SendChannel,
            pb.SendChannelRequest(connection_id=start.connection_id),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            gateway.channels.SendChannel,
            pb.SendChannelRequest(
                connection_id=start.connection_id, messages=[text("x", **{"busmq-control": "end"})]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_MESSAGE",
        ),
        (
            gateway.channels.SendChannel,
            pb.SendChannelRequest(
                connection_id=start.connection_id,
                messages=[
                    types_pb2.OutgoingMessage(payload=b"{", kind=types_pb2.PAYLOAD_KIND_JSON)
                ],
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_MESSAGE",
        ),
        (
            gateway.channels.SendToRole,
            pb.SendToRoleRequest(channel="strict", role="", messages=[text("x")]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_NAME",
        ),
        (
            gateway.channels.SendToRole,
            pb.SendToRoleRequest(channel="strict", role="remote", messages=[]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            gateway.channels.AckChannel,
            pb.AckChannelRequest(channel="strict", role="a:b", ids=[1]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_NAME",
        ),
        (
            gateway.channels.EndChannel,
            pb.EndChannelRequest(connection_id="nope"),
            grpc.StatusCode.NOT_FOUND,
            "CONNECTION_NOT_FOUND",
        ),
    ]
    for method, request, code, reason in cases:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await method(request, metadata=AUTH)
        assert (error.value.code(), error_info(error.value).reason) == (code, reason), request
    # The stream was not disturbed: a good send still goes through.
    sent = await gateway.channels.SendChannel(
        pb.SendChannelRequest(connection_id=start.connection_id, messages=[text("ok")]),
        metadata=AUTH,
    )
    assert len(sent.ids) == 1
    stream.cancel()


async def test_draining_ends_a_channel_stream_and_disconnects_its_end(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    peer = peer_bus.channel("drained")
    peer_events = recorder(peer)
    await peer.connect()
    stream = connect(gateway, channel="drained", listen=True)
    await started(stream)
    assert await stream.events(1) == [("state", "remote_connected")]
    await gateway.gateway.stop()
    assert await stream.rest() == [("state", "draining")]
    await eventually(lambda: "remote_disconnected" in peer_events, what="peer told")
