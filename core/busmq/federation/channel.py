"""Federated channels: one end of a channel whose queues live behind a remote gateway.

``bus.federate(bus.channel("chat", "b", "a"), "https://gateway-a:8443")`` returns a
:class:`FederatedChannel` with the API and events of :class:`busmq.Channel`: the end is
a ``ConnectChannel`` stream on the gateway, which plays it on the remote bus.

What differs, because the end crosses a network:

* **Resuming.** If the stream breaks (a network cut, a gateway restart or drain), the
  end reconnects with backoff and carries on: the gateway's end disconnected when the
  stream broke (the peer sees ``remote_disconnected``) and the new stream connects it
  again (the peer sees ``remote_connected``: the connection is re-announced). This end
  emits ``connected`` again with ``resumed`` in its details. What is delivered across
  the break is what the mode promises, as for a federated consumer
  (:mod:`busmq.federation.consume_stream`): at-least-once redelivers everything not acked
  (deliveries fetched but not handed out are dropped here, so none is handed out
  twice), replay resumes after the last id seen, at-most-once may lose what the
  gateway had read but not yet delivered when the link broke.
* **Sending while the link is down.** ``send`` pushes into the peer's queue as a local
  end does, through the federated push path; it returns ``None`` when the message went
  to the durable outbox (the link is down, the call failed ambiguously, or earlier sends
  still wait there), which forwards it in order, with the same ``request_id``. A
  forwarded message whose peer queue has expired is dead-lettered unless this end is
  connected again by then.
* **Acks** of at-least-once deliveries go through ``AckChannel`` and are batched per
  event-loop tick. There is no remote ``nack``: a delivery given back (a handler that
  raised) comes again after the visibility timeout, or at once when the end
  disconnects (the gateway releases an end's unacked deliveries then).
* ``send_to`` calls the gateway directly (no outbox) and raises
  ``BusUnavailableError`` while the link is down.

Link events are re-emitted on ``channel.events`` with the link URL as ``source``
(``ready``, ``unauthorized``, ``closed`` for the link, ``error``, ``state``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from ..acks import AckBatcher
from ..channel import Channel
from ..channel_end import ChannelEnd, EndOptions
from ..channel_protocol import (
    ChannelState,
    channel_queue_name,
    check_encoded_headers,
)
from ..consuming import Mode
from ..errors import (
    BusClosedError,
    BusError,
    ChannelEndedError,
    ChannelStateError,
    QueueNotFoundError,
    UnknownMessageError,
)
from ..events import Event
from ..message import EncodedMessage, Payload, check_headers, encode, with_encoded_headers
from ..pushing import PushResult
from ..v1 import channel_service_pb2 as pb
from ..v1 import channel_service_pb2_grpc as pb_grpc
from ..v1 import queue_service_pb2 as queue_pb
from ..wire import MODE_TO_PROTO
from .backoff import Backoff
from .convert import Settle, delivery, duration, outgoing
from .errors import (
    RemoteError,
    error_reason,
    from_rpc_error,
)
from .link import Link, LinkState
from .queue import checked_request_id, push_or_queue
from .streams import StreamBroken, first_response, read

if TYPE_CHECKING:
    from .context import FederationContext

log = logging.getLogger(__name__)

_FINAL = frozenset({"ended", "disconnected"})
_DISCONNECT_GRACE = 2.0  # seconds a disconnect waits for the gateway to confirm


class FederatedChannel(ChannelEnd):
    """One end of a channel in another datacenter (see the module docstring).

    Attributes:
        name, local, remote, ttl: as for :class:`busmq.Channel`.
        role: the role this end plays (set by ``connect``/``listen``).
        remote_connected: whether the last signal from the peer was a connect.
        link: the :class:`~busmq.federation.Link` to the gateway.
        events: channel and link events.
        reconnects: streams reopened after a break.

    ``connect`` and ``listen`` take the arguments of :meth:`busmq.Channel.connect`.
    Refusals (bad arguments, wrong credentials, an ended channel) raise there, and so
    does a link that is down (``BusUnavailableError``): an end that never connected has
    nothing to resume.
    """

    def __init__(self, manager: FederationContext, link: Link, channel: Channel) -> None:
        super().__init__(channel.name, channel.local, channel.remote, channel.ttl)
        self.link = link
        self.reconnects = 0
        self._manager = manager
        self.tracing = manager.bus.tracing
        self._request: pb.ConnectChannelRequest | None = None
        self._connection_id: str | None = None
        self._reader: asyncio.Task[None] | None = None
        self._opened: Any = None  # the stream opened by _connect_end, until it is read
        self._acks = AckBatcher(self.name, self._ack_ids)
        self._leaving = False
        self._live = asyncio.Event()  # a stream is open: the gateway knows this end
        self._next_replay_id = 0

    def __repr__(self) -> str:
        return (
            f"<FederatedChannel {self.name!r} role={self.role!r} {self._state.value} "
            f"via {self.link.url}>"
        )

    @property
    def target(self) -> str:
        return self.link.url

    @property
    def outbox_depth(self) -> int:
        """Messages sent to the peer that wait in the outbox."""
        return self._manager.outbox.queue_depth(self.target, self._outbound_queue)

    @property
    def _outbound_queue(self) -> str:
        return channel_queue_name(self.name, self.peer_role)

    # -- connecting -------------------------------------------------------------------

    async def _connect_end(self, listen: bool, options: EndOptions) -> None:
        if options.from_id < 0:
            raise ValueError(f"from_id must not be negative, got {options.from_id}")
        await self._require_usable()
        self._request = self._connect_request(
            listen=listen,
            mode=MODE_TO_PROTO[options.mode],
            from_id=options.from_id,
            prefetch=options.prefetch,
            visibility_timeout=duration(options.visibility_timeout),
        )
        self._next_replay_id = options.from_id
        try:
            self._opened = await self._start_stream()
        except StreamBroken as broken:
            raise broken.error from None
        self._leaving = False

    def _connect_request(self, **fields: Any) -> pb.ConnectChannelRequest:
        request = pb.ConnectChannelRequest(
            channel=self.name, local_role=self.local, remote_role=self.remote, **fields
        )
        if self.ttl is not None:
            request.ttl.CopyFrom(duration(self.ttl))
        return request

    def _start_receiving(self) -> None:
        call, self._opened = self._opened, None
        self._manager.note_attached(self, self._outbound_queue, True)
        self._reader = asyncio.create_task(
            self._read_loop(call), name=f"busmq-federated-channel {self.name}:{self.role}"
        )

    async def _start_stream(self) -> Any:
        """Open a ConnectChannel stream and wait for ``started``; returns the call.

        Raises the mapped error for refusals, :class:`StreamBroken` for what is retried."""
        assert self._request is not None
        link = self.link
        call = link.stub(pb_grpc.ChannelServiceStub).ConnectChannel(
            self._request, metadata=link.metadata, wait_for_ready=True
        )
        first = await first_response(call, link, "the channel stream", self._error)
        if first.WhichOneof("event") != "started":
            call.cancel()
            raise StreamBroken(BusError("the channel stream did not start with `started`"))
        self._connection_id = first.started.connection_id
        self._live.set()
        return call

    # -- the stream -------------------------------------------------------------------

    async def _read_loop(self, call: Any) -> None:
        settings = self.link.settings
        backoff = Backoff(settings.reconnect_backoff_initial, settings.reconnect_backoff_max)
        lost: BaseException | None = None
        try:
            while True:
                try:
                    if await self._pump(call):
                        return  # ended or disconnected: the pump settled the state
                except StreamBroken as broken:
                    self._report(broken.error)
                finally:
                    call.cancel()
                    self._connection_id = None
                    self._live.clear()
                if self._leaving:
                    return
                self._after_break()
                call = await self._resume(backoff)
        except asyncio.CancelledError:
            if not self._leaving:
                raise
        except BusError as exc:
            lost = exc
            self._report(exc)
        finally:
            if self._reader is asyncio.current_task():
                self._reader = None
            if self._state is ChannelState.CONNECTED and not self._leaving:
                # Refused for good while resuming (the channel's queues are gone,
                # the credentials were revoked...): this end is disconnected.
                await self._settle_disconnected("lost", error=lost)

    async def _resume(self, backoff: Backoff) -> Any:
        """Reopen the stream once the link is usable; returns the call."""
        while True:
            await asyncio.sleep(backoff.next())
            if not await self.link.wait_usable():
                if self.link.state is LinkState.CLOSED:
                    raise BusClosedError(f"the link to {self.link.url} is closed")
                continue
            if self._request is not None and self._mode is Mode.REPLAY:
                self._request.from_id = self._next_replay_id
            try:
                call = await self._start_stream()
            except StreamBroken as broken:
                self._report(broken.error)
                continue
            backoff.reset()
            self.reconnects += 1
            self._emit("connected", role=self.role, mode=self._mode.value, resumed=True)
            return call

    async def _pump(self, call: Any) -> bool:
        """Move the stream's deliveries and events into this end; True when the end is
        over (ended or disconnected), False when the stream ended without saying so."""
        settle = self._settler() if self._mode is Mode.AT_LEAST_ONCE else None
        while True:
            response = await read(call, self.link, self._error)
            if response is grpc.aio.EOF:
                return False
            event = response.WhichOneof("event")
            if event == "delivery":
                item = delivery(response.delivery, settle)
                if self._mode is Mode.REPLAY:
                    self._next_replay_id = item.id + 1
                await self._deliver(item)
            elif event == "state" and await self._on_state(response.state):
                return True

    async def _on_state(self, state: Any) -> bool:
        """Apply a state event of the remote end; True if it was the last one."""
        kind = state.kind
        details = dict(state.details)
        if kind in ("remote_connected", "remote_disconnected"):
            self._peer_signal(kind == "remote_connected")
        elif kind == "ended":
            if details.get("by") == "remote":
                await self._ended_by_peer()
            return True
        elif kind == "disconnected":
            if not self._leaving:
                await self._settle_disconnected(details.get("reason", "lost"))
            return True
        elif kind == "error":
            reason = details.pop("reason", "")
            error = RemoteError("CHANNEL", reason, f"channel {self.name!r} failed remotely")
            self.events.emit(Event("error", self.name, error=error, details=details))
        return False

    def _after_break(self) -> None:
        if self._mode is Mode.AT_LEAST_ONCE:
            # The gateway released the broken end's unacked deliveries: those not handed
            # out yet come again on the next stream, so do not hand them out twice.
            self._inbox.take_all()

    def _report(self, error: BusError) -> None:
        log.info("channel %s: stream broke: %s", self.name, error)
        self.events.emit(Event("error", self.name, error=error))

    # -- sending ----------------------------------------------------------------------

    async def send(
        self, message: Payload, *, headers: Mapping[str, str] | None = None
    ) -> int | None:
        """Send a message to the peer: its id in the peer's queue, or ``None`` if it
        waits in the outbox (durably; forwarded in order).

        Raises as :meth:`busmq.Channel.send`, and ``OutboxFullError`` if it had to wait
        and the outbox is full.
        """
        check_headers(headers)
        limit = self._manager.bus.settings.max_message_bytes
        result = await self.send_encoded([encode(message, headers, limit)])
        return None if result is None else result.ids[0]

    async def send_encoded(
        self, messages: Sequence[EncodedMessage], *, request_id: str | None = None
    ) -> PushResult | None:
        """Send encoded messages atomically, in order; ``None`` if they wait in the
        outbox. ``request_id`` makes a retry idempotent (a random one if not given)."""
        check_encoded_headers(messages)
        self._require_connected()
        if not messages:
            return PushResult([], False)
        if self.tracing is not None:
            carrier = self.tracing.current_headers()
            messages = [with_encoded_headers(m, carrier) for m in messages] if carrier else messages
        # As a local end does: a push into the peer's queue (so direct sends and the
        # outbox share one path, order and dedupe).
        request = queue_pb.PushRequest(
            queue=self._outbound_queue,
            messages=outgoing(messages),
            request_id=checked_request_id(request_id),
        )
        try:
            response = await push_or_queue(self._manager, self.link, request, len(messages))
        except QueueNotFoundError:
            raise self._peer_queue_gone() from None
        return None if response is None else PushResult(list(response.ids), response.duplicate)

    async def send_to(
        self, role: str, message: Payload, *, headers: Mapping[str, str] | None = None
    ) -> int:
        """Push a message to the queue of ``role`` without connecting (the queue is
        created if needed); returns its id. Direct only: raises
        ``BusUnavailableError`` while the link is down."""
        check_headers(headers)
        self._check_send_to(role)
        await self._require_usable()
        limit = self._manager.bus.settings.max_message_bytes
        request = pb.SendToRoleRequest(
            channel=self.name,
            role=role,
            messages=outgoing([encode(message, headers, limit)]),
            request_id=uuid.uuid4().hex,
        )
        if self.ttl is not None:
            request.ttl.CopyFrom(duration(self.ttl))
        response = await self._call("SendToRole", request)
        return int(response.ids[0])

    # -- receiving --------------------------------------------------------------------

    async def _ack(self, ids: list[int]) -> int:
        unknown = await self._ack_ids(ids)
        if unknown:
            raise UnknownMessageError(self.name, unknown)
        return len(ids)

    async def _ack_ids(self, ids: list[int]) -> list[int]:
        if not ids:
            return []
        request = pb.AckChannelRequest(channel=self.name, role=self.role, ids=ids)
        response = await self._call("AckChannel", request)
        return [int(i) for i in response.unknown_ids]

    def _settler(self) -> Settle:
        async def settle(message_id: int, ack: bool) -> None:
            if self._state is ChannelState.ENDED:
                return  # the queue is gone; nothing is left to settle
            if ack:
                await self._acks.ack(message_id)
            # No remote nack: the delivery comes back after the visibility timeout.

        return settle

    # -- disconnecting and ending -----------------------------------------------------

    async def disconnect(self, *, release_unacked: bool = False) -> None:
        """Tell the peer and stop receiving; messages keep coming into this end's queue
        for the next ``connect``/``listen``. At-most-once deliveries already received
        stay available to the iteration; at-least-once ones not acked are given back
        by the gateway at once (``release_unacked`` is implied)."""
        async with self._lock:
            if self._state is not ChannelState.CONNECTED:
                return
            self._leaving = True
            self._inbox.set_unbounded()  # the pump may finish without the app reading
            connection = self._connection_id
            if connection and self.link.usable:
                try:
                    await self._call(
                        "DisconnectChannel", pb.DisconnectChannelRequest(connection_id=connection)
                    )
                except BusError as exc:
                    log.info("channel %s: could not disconnect remotely: %s", self.name, exc)
            await self._stop_reader(grace=_DISCONNECT_GRACE if connection else 0.0)
            if self._state is ChannelState.CONNECTED:
                await self._settle_disconnected("local")

    async def end(self) -> None:
        """End the channel for both ends (see :meth:`busmq.Channel.end`). Without a
        connection, this end connects as ``local`` to deliver the ``end``."""
        async with self._lock:
            if self._state is ChannelState.ENDED:
                return
            await self._require_usable()
            self._leaving = True
            if self._connection_id is None:
                if self._request is None:
                    self._request = self._connect_request()
                await self._stop_reader(grace=0.0)
                try:
                    call = await self._start_stream()
                except StreamBroken as broken:
                    raise broken.error from None
                self._reader = asyncio.create_task(self._drain(call))
            connection = self._connection_id
            assert connection is not None
            await self._call("EndChannel", pb.EndChannelRequest(connection_id=connection))
            self._state = ChannelState.ENDED
            await self._stop_reader(grace=_DISCONNECT_GRACE)
            self._teardown()
        self._emit("ended", by="local")

    async def _drain(self, call: Any) -> None:
        """Read a stream opened only to end the channel, until the gateway closes it."""
        with contextlib.suppress(grpc.aio.AioRpcError):
            while await call.read() is not grpc.aio.EOF:
                pass

    async def _remove_end(self) -> None:
        self._teardown()

    async def _settle_disconnected(self, reason: str, error: BaseException | None = None) -> None:
        self._state = ChannelState.DISCONNECTED
        self._teardown()
        details = {"reason": reason}
        self.events.emit(Event("disconnected", self.name, error=error, details=details))

    async def _stop_reader(self, *, grace: float) -> None:
        reader = self._reader
        if reader is None or reader is asyncio.current_task():
            return
        if grace > 0:
            _, pending = await asyncio.wait({reader}, timeout=grace)
            if not pending:
                return
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    def _teardown(self) -> None:
        self._connection_id = None
        self._live.set()  # wakes reattach(), which then sees the end is over
        self.remote_connected = False
        self._manager.note_attached(self, self._outbound_queue, False)
        self._inbox.close()

    async def reattach(self) -> bool:
        """For the outbox: a forwarded send found the peer's queue gone. True once this
        end is connected again (its stream re-created the queues), False if it ended."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.link.operation_timeout):
                await self._live.wait()
        return self._state is ChannelState.CONNECTED and self._connection_id is not None

    # -- federation plumbing ----------------------------------------------------------

    def _on_link_event(self, event: Event) -> None:
        self.events.emit(event)

    async def _release(self) -> None:
        await self.disconnect()

    async def _stop_local(self) -> None:
        self._leaving = True
        await self._stop_reader(grace=0.0)
        if self._state is ChannelState.CONNECTED:
            self._state = ChannelState.DISCONNECTED
            self._teardown()
        await self._acks.drain()

    async def _require_usable(self) -> None:
        if self._manager.closed:
            raise BusClosedError("federation is closed")
        await self.link.require_usable()

    async def _call(self, method: str, request: Any) -> Any:
        link = self.link
        if link.state is LinkState.CLOSED:
            raise BusClosedError(f"the link to {link.url} is closed")
        try:
            return await link.call(method, request, kind=pb_grpc.ChannelServiceStub)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.aio.AioRpcError) -> BusError:
        reason = error_reason(exc)
        if reason == "CHANNEL_ENDED":
            return ChannelEndedError(self.name)
        if reason == "CHANNEL_STATE":
            return ChannelStateError(self.name, exc.details() or "")
        return from_rpc_error(exc, queue=self.name, target=self.target)
