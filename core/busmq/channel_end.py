"""What every end of a channel does, local or federated: its roles and state, the
delivery of data to the iteration or the handler, the peer's signals, the checks of a
send to a role, and the events."""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from .channel_protocol import ChannelState, Handler
from .consuming import Mode, check_consume_arguments
from .errors import BusError, ChannelEndedError, ChannelStateError, InvalidNameError
from .events import Event, EventHub
from .inbox import Inbox
from .message import Delivery

if TYPE_CHECKING:
    from .tracing import Tracing

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EndOptions:
    """How an end receives (the arguments of ``connect``/``listen``)."""

    mode: Mode
    handler: Handler | None
    prefetch: int
    visibility_timeout: float
    from_id: int


class ChannelEnd(abc.ABC):
    """The part of :class:`busmq.Channel` and :class:`~busmq.federation.FederatedChannel`
    that does not depend on where the channel's queues live.

    Attributes:
        name, local, remote, ttl: the channel and its two roles.
        role: the role this end plays (set by ``connect``/``listen``).
        remote_connected: whether the last signal from the peer was a connect.
        events: channel events (see :class:`busmq.Channel`).
    """

    tracing: Tracing | None = None
    """Trace propagation (:mod:`busmq.tracing`): a handler runs in a span per message."""

    def __init__(self, name: str, local: str, remote: str, ttl: float | None) -> None:
        self.name = name
        self.local = local
        self.remote = remote
        self.ttl = ttl
        self.events: EventHub[Event] = EventHub()
        self.role = local
        self.remote_connected = False
        self._state = ChannelState.IDLE
        self._mode = Mode.AT_MOST_ONCE
        self._handler: Handler | None = None
        self._inbox = Inbox(1)
        self._lock = asyncio.Lock()

    @property
    def state(self) -> ChannelState:
        return self._state

    @property
    def peer_role(self) -> str:
        """The role of the other end."""
        return self.remote if self.role == self.local else self.local

    # -- connecting -------------------------------------------------------------------

    async def connect(
        self,
        mode: Mode = Mode.AT_MOST_ONCE,
        *,
        handler: Handler | None = None,
        prefetch: int = 100,
        visibility_timeout: float = 30.0,
        from_id: int = 0,
    ) -> None:
        """Connect as the ``local`` role: receive from ``N:to:<local>``, send to the remote.

        Args:
            mode: how this end consumes its queue, as for :meth:`Queue.consume`.
            handler: called for each data delivery, in order, instead of the
                iteration; in at-least-once mode the delivery is acked when it
                returns and given back when it raises.
            prefetch: messages fetched ahead, and the bound of the delivery buffer.
            visibility_timeout: at-least-once: seconds before an unacked delivery
                is redelivered to another end of the same role.
            from_id: replay only: the first message id to read (0: the oldest kept).
        """
        await self._open(False, EndOptions(mode, handler, prefetch, visibility_timeout, from_id))

    async def listen(
        self,
        mode: Mode = Mode.AT_MOST_ONCE,
        *,
        handler: Handler | None = None,
        prefetch: int = 100,
        visibility_timeout: float = 30.0,
        from_id: int = 0,
    ) -> None:
        """Connect as the ``remote`` role (the roles swapped); see :meth:`connect`."""
        await self._open(True, EndOptions(mode, handler, prefetch, visibility_timeout, from_id))

    async def _open(self, listen: bool, options: EndOptions) -> None:
        """Connect as ``remote`` (``listen``) or ``local``."""
        check_consume_arguments(
            options.mode,
            max=None,
            from_id=options.from_id,
            prefetch=options.prefetch,
            visibility_timeout=options.visibility_timeout,
            max_deliveries=None,
            retry_policy=None,
        )
        async with self._lock:
            if self._state is ChannelState.ENDED:
                raise ChannelEndedError(self.name)
            if self._state is ChannelState.CONNECTED:
                raise ChannelStateError(self.name, f"already connected as {self.role!r}")
            self.role = self.remote if listen else self.local
            self._mode, self._handler = options.mode, options.handler
            await self._connect_end(listen, options)
            self._inbox = Inbox(options.prefetch)
            self._state = ChannelState.CONNECTED
            self._emit("connected", role=self.role, mode=options.mode.value)
            self._start_receiving()

    @abc.abstractmethod
    async def _connect_end(self, listen: bool, options: EndOptions) -> None:
        """Make this end known where the queues live (the peer is told); raises and
        leaves nothing behind if it cannot."""

    @abc.abstractmethod
    def _start_receiving(self) -> None:
        """Start the task that moves deliveries and the peer's signals into this end."""

    @abc.abstractmethod
    async def disconnect(self, *, release_unacked: bool = False) -> None:
        """Tell the peer and stop receiving (see :meth:`busmq.Channel.disconnect`)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()

    # -- receiving --------------------------------------------------------------------

    async def ack(self, *ids: int) -> int:
        """Acknowledge at-least-once deliveries by id; raises
        :class:`UnknownMessageError` for ids that were not pending. After the channel
        ended this is a no-op (its queues are gone) returning 0."""
        if self._state is ChannelState.ENDED:
            return 0
        if self._state is ChannelState.IDLE:
            raise ChannelStateError(self.name, "never connected")
        return await self._ack(list(ids))

    @abc.abstractmethod
    async def _ack(self, ids: list[int]) -> int:
        """Acknowledge in this end's queue; how many."""

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        if self._state is ChannelState.IDLE:
            raise ChannelStateError(self.name, "connect or listen before iterating")
        delivery = await self._inbox.get()
        if delivery is None:
            raise StopAsyncIteration
        return delivery

    async def _deliver(self, delivery: Delivery) -> None:
        """Data from the peer: to the handler (settled by how it ends), else to the
        iteration."""
        handler = self._handler
        if handler is None:
            await self._inbox.put(delivery)
            self._emit("message", delivery=delivery)
            return
        self._emit("message", delivery=delivery)
        try:
            if self.tracing is None:
                await handler(delivery)
            else:
                with self.tracing.process(self.name, delivery.headers, delivery.id):
                    await handler(delivery)
        except Exception:
            log.exception("channel %s handler failed on #%d", self.name, delivery.id)
            await self._settle_quietly(delivery, ack=False)
        else:
            await self._settle_quietly(delivery, ack=True)

    async def _settle_quietly(self, delivery: Delivery, *, ack: bool) -> None:
        """Ack or nack for the app; a failure is an ``error`` event, not the end of the
        channel (the delivery comes back after the visibility timeout)."""
        try:
            await (delivery.ack() if ack else delivery.nack())
        except BusError as exc:
            log.info("channel %s: could not settle #%d: %s", self.name, delivery.id, exc)
            self.events.emit(Event("error", self.name, error=exc))

    async def _ended_by_peer(self) -> None:
        # Runs in the receiving task; ``end()`` and ``disconnect()`` stop that task
        # under the lock, so taking the lock here could deadlock: the state check
        # suffices.
        if self._state is not ChannelState.CONNECTED:
            return
        self._state = ChannelState.ENDED
        await self._remove_end()
        self._emit("ended", by="remote")

    @abc.abstractmethod
    async def _remove_end(self) -> None:
        """The peer ended the channel: stop receiving and let go of its queues."""

    def _peer_signal(self, connected: bool) -> None:
        """The peer connected or disconnected."""
        self.remote_connected = connected
        self._emit("remote_connected" if connected else "remote_disconnected")

    # -- checks and events ------------------------------------------------------------

    def _check_send_to(self, role: str) -> None:
        if role not in (self.local, self.remote):
            raise InvalidNameError(role, f"not a role of channel {self.name!r}")
        if self._state is ChannelState.ENDED:
            raise ChannelEndedError(self.name)

    def _peer_queue_gone(self) -> ChannelEndedError:
        """A send found the peer's queue gone: the peer ended the channel (its ``end``
        is on its way to this end) or the queue expired."""
        return ChannelEndedError(self.name, "the peer's queue is gone (ended)")

    def _require_connected(self) -> None:
        if self._state is ChannelState.ENDED:
            raise ChannelEndedError(self.name)
        if self._state is not ChannelState.CONNECTED:
            raise ChannelStateError(self.name, "not connected (use send_to to send anyway)")

    def _emit(self, kind: str, **details: object) -> None:
        self.events.emit(Event(kind, self.name, details=dict(details)))
