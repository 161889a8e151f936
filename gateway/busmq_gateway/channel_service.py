"""``busmq.v1.ChannelService``: one connected channel end per ConnectChannel stream."""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import grpc

from busmq import Bus, BusError, Channel, Delivery, Event, Mode, UnknownMessageError
from busmq.channel_protocol import channel_queue_name, send_encoded_to_role, validate_role
from busmq.keys import validate_name
from busmq.v1 import channel_service_pb2 as pb
from busmq.v1 import channel_service_pb2_grpc as pb_grpc
from busmq.v1 import types_pb2

from .access import caller, check_owner
from .config import GatewaySettings
from .convert import consume_mode, delivery_fields, optional_seconds, outgoing_batch
from .errors import RequestError, classify, rpc_errors, to_status, unary
from .fleet import CONNECTION, FleetKey
from .relay import Relay
from .streaming import Beat, StreamCount, now, paced

log = logging.getLogger(__name__)

_FINAL = frozenset({"ended", "disconnected"})
_ByConnection = pb.SendChannelRequest | pb.DisconnectChannelRequest | pb.EndChannelRequest


class ChannelService(pb_grpc.ChannelServiceServicer):
    def __init__(
        self,
        bus: Bus,
        settings: GatewaySettings,
        fleet: FleetKey,
        relay: Relay,
        draining: asyncio.Event,
    ) -> None:
        self._bus = bus
        self._settings = settings
        self._fleet = fleet
        self._relay = relay
        self._draining = draining
        self._connections: dict[str, Channel] = {}  # the ends this gateway holds, by key
        self.streams = StreamCount()
        relay.route(
            "SendChannel", self._send, pb.SendChannelRequest, pb.SendChannelResponse, CONNECTION
        )
        relay.route(
            "DisconnectChannel",
            self._disconnect,
            pb.DisconnectChannelRequest,
            pb.DisconnectChannelResponse,
            CONNECTION,
        )
        relay.route(
            "EndChannel", self._end, pb.EndChannelRequest, pb.EndChannelResponse, CONNECTION
        )

    # -- the connection stream ---------------------------------------------------------

    async def ConnectChannel(
        self, request: pb.ConnectChannelRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ConnectChannelResponse]:
        with self.streams.open():
            channel: Channel | None = None
            feed: _Feed | None = None
            async with rpc_errors(context, "ConnectChannel"):
                channel, feed = await self._connect(request)
            if channel is None or feed is None:  # pragma: no cover - rpc_errors aborted
                return
            key = secrets.token_urlsafe(12)
            self._connections[key] = channel
            # The id routes later calls to this gateway, which holds the end.
            connection_id = self._fleet.sign(CONNECTION, caller().name, self._relay.gateway_id, key)
            try:
                yield pb.ConnectChannelResponse(
                    started=pb.ChannelStarted(
                        connection_id=connection_id, role=channel.role, peer_role=channel.peer_role
                    )
                )
                async for response in self._responses(channel, feed):
                    yield response
            except BusError as exc:
                await context.abort_with_status(to_status(exc))
            finally:
                self._connections.pop(key, None)
                feed.close()
                await self._leave(channel)

    async def _connect(self, request: pb.ConnectChannelRequest) -> tuple[Channel, _Feed]:
        await self._relay.ensure_serving()
        mode = consume_mode(request.mode)
        prefetch = request.prefetch or self._settings.default_prefetch
        if prefetch > self._settings.max_prefetch:
            raise RequestError(f"prefetch must be at most {self._settings.max_prefetch}")
        if mode is not Mode.REPLAY and request.from_id:
            raise RequestError("from_id applies to replay only")
        visibility = optional_seconds(request, "visibility_timeout", 30.0)
        assert visibility is not None
        channel = self._bus.channel(
            request.channel,
            request.local_role or "local",
            request.remote_role or "remote",
            ttl=optional_seconds(request, "ttl"),
        )
        feed = _Feed(channel)  # before connecting, so that ``connected`` is in it
        start = channel.listen if request.listen else channel.connect
        try:
            await start(
                mode, prefetch=prefetch, visibility_timeout=visibility, from_id=request.from_id
            )
        except BaseException:
            feed.close()
            raise
        return channel, feed

    async def _responses(
        self, channel: Channel, feed: _Feed
    ) -> AsyncIterator[pb.ConnectChannelResponse]:
        async for item in paced(feed.items(), self._draining, self._settings.heartbeat_seconds):
            if item is Beat.HEARTBEAT:
                yield pb.ConnectChannelResponse(heartbeat=types_pb2.Heartbeat(time=now()))
            elif item is Beat.DRAINING:
                yield _state("draining", channel.name, {})
                return
            elif isinstance(item, Delivery):
                yield pb.ConnectChannelResponse(delivery=delivery_fields(item))
            elif isinstance(item, Event):
                yield _state(item.kind, channel.name, _event_details(item))

    async def _leave(self, channel: Channel) -> None:
        """The stream is over: disconnect its end (a no-op after an end or a
        disconnect); unacked at-least-once deliveries are redelivered promptly."""
        try:
            await channel.disconnect(release_unacked=True)
        except BusError as exc:
            log.warning("disconnecting channel %s: %s", channel.name, exc)

    # -- unary -------------------------------------------------------------------------

    @unary
    async def SendChannel(
        self, request: pb.SendChannelRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendChannelResponse:
        result: pb.SendChannelResponse = await self._at_holder("SendChannel", request, context)
        return result

    async def _send(self, request: pb.SendChannelRequest) -> pb.SendChannelResponse:
        channel = self._connection(request.connection_id)
        encoded = outgoing_batch(request.messages, self._bus.settings.max_message_bytes)
        result = await channel.send_encoded(encoded, request_id=request.request_id or None)
        return pb.SendChannelResponse(ids=result.ids, duplicate=result.duplicate)

    @unary
    async def SendToRole(
        self, request: pb.SendToRoleRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendToRoleResponse:
        validate_name(request.channel)
        validate_role(request.role)
        encoded = outgoing_batch(request.messages, self._bus.settings.max_message_bytes)
        result = await send_encoded_to_role(
            self._bus,
            request.channel,
            request.role,
            encoded,
            request_id=request.request_id or None,
            ttl=optional_seconds(request, "ttl"),
        )
        return pb.SendToRoleResponse(ids=result.ids, duplicate=result.duplicate)

    @unary
    async def AckChannel(
        self, request: pb.AckChannelRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckChannelResponse:
        validate_name(request.channel)
        validate_role(request.role)
        if not request.ids:
            raise RequestError("ids must not be empty")
        queue = self._bus.queue(channel_queue_name(request.channel, request.role))
        try:
            acked = await queue.ack(*request.ids)
        except UnknownMessageError as exc:
            return pb.AckChannelResponse(
                acked=len(request.ids) - len(exc.ids), unknown_ids=list(exc.ids)
            )
        return pb.AckChannelResponse(acked=acked)

    @unary
    async def DisconnectChannel(
        self, request: pb.DisconnectChannelRequest, context: grpc.aio.ServicerContext
    ) -> pb.DisconnectChannelResponse:
        result: pb.DisconnectChannelResponse = await self._at_holder(
            "DisconnectChannel", request, context
        )
        return result

    async def _disconnect(
        self, request: pb.DisconnectChannelRequest
    ) -> pb.DisconnectChannelResponse:
        await self._connection(request.connection_id).disconnect(release_unacked=True)
        return pb.DisconnectChannelResponse()

    @unary
    async def EndChannel(
        self, request: pb.EndChannelRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndChannelResponse:
        result: pb.EndChannelResponse = await self._at_holder("EndChannel", request, context)
        return result

    async def _end(self, request: pb.EndChannelRequest) -> pb.EndChannelResponse:
        await self._connection(request.connection_id).end()
        return pb.EndChannelResponse()

    async def _at_holder(
        self, method: str, request: _ByConnection, context: grpc.aio.ServicerContext
    ) -> Any:
        """``method`` on the gateway that holds the connection, once the id is the caller's."""
        owner, holder, _ = self._fleet.open(CONNECTION, request.connection_id)
        check_owner(owner, "connection_id")
        return await self._relay.at_holder(holder, method, request, context)

    def _connection(self, connection_id: str) -> Channel:
        """The end this gateway holds for ``connection_id`` (checked by the caller)."""
        _, _, key = self._fleet.open(CONNECTION, connection_id)
        channel = self._connections.get(key)
        if channel is None:
            raise CONNECTION.not_found()
        return channel


class _Feed:
    """A channel end's deliveries and events, in the order they happened.

    The channel's pump emits every event in order, a ``message`` event right after it
    put that delivery into the channel's bounded buffer; so the events alone give the
    order, and each ``message`` event takes the next delivery from the buffer. Reading
    the buffer only then keeps its bound (the slow-reader back-pressure) intact.
    """

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._events: collections.deque[Event] = collections.deque()
        self._ready = asyncio.Event()
        self._unsubscribe = channel.events.on(self._on_event)

    def _on_event(self, event: Event) -> None:
        self._events.append(event)
        self._ready.set()

    def close(self) -> None:
        self._unsubscribe()

    async def items(self) -> AsyncIterator[Delivery | Event]:
        """Deliveries and events (not ``message``); ends after ``ended`` or
        ``disconnected``."""
        while True:
            while not self._events:
                self._ready.clear()
                await self._ready.wait()
            event = self._events.popleft()
            if event.kind == "message":
                try:
                    delivery = await self._channel.__anext__()
                except StopAsyncIteration:
                    continue  # a disconnect gave it back for redelivery
                yield delivery
                continue
            yield event
            if event.kind in _FINAL:
                return


def _event_details(event: Event) -> dict[str, str]:
    details = {k: str(v) for k, v in event.details.items() if k != "delivery"}
    if event.error is not None:
        _, reason, _ = classify(event.error)
        details["reason"] = reason
    return details


def _state(kind: str, source: str, details: dict[str, str]) -> pb.ConnectChannelResponse:
    return pb.ConnectChannelResponse(
        state=types_pb2.StateEvent(kind=kind, source=source, details=details)
    )
