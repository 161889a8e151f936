"""Channels: bidirectional peer-to-peer links built on two queues of the bus.

A channel ``N`` between roles ``a`` and ``b`` is the pair of queues ``N:to:a`` (what
the end playing ``a`` receives) and ``N:to:b``. Each end attaches both queues, so the
channel lives (and is sharded, and expires) exactly like its queues: while an end is
attached, then for the idle ttl. A peer may send before the other end connected: the
messages wait in the other end's queue.

Control signals travel as messages on the same queues, marked by the header
``busmq-control`` (``connect``, ``disconnect``, ``end``), so they keep their order
with the data: a peer sees every message sent before a ``disconnect`` or ``end``
first. Data headers starting with ``busmq-`` are reserved.

``end()`` pushes ``end`` to the peer's queue, deletes its own queue and detaches the
peer's; the peer deletes that one when it takes the ``end`` (if no peer ever comes,
it expires after the ttl like any queue).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from .channel_end import ChannelEnd, EndOptions
from .channel_protocol import (
    CONTROL_HEADER,
    QUEUE_INFIX,
    ChannelState,
    channel_queue_name,
    check_encoded_headers,
    validate_role,
)
from .consumer import Consumer
from .consuming import Mode
from .errors import (
    BusError,
    ChannelEndedError,
    ChannelStateError,
    InvalidNameError,
    QueueNotFoundError,
)
from .events import Event
from .keys import MAX_NAME_LENGTH, validate_name
from .message import Delivery, EncodedMessage, Payload, check_headers
from .pushing import PushResult
from .queue import Queue

if TYPE_CHECKING:
    from .context import BusContext

__all__ = ["Channel", "ChannelEndedError", "ChannelState", "ChannelStateError"]

log = logging.getLogger(__name__)

_DISCONNECT_DRAIN_SECONDS = 0.5


class Channel(ChannelEnd):
    """One end of a bidirectional channel: ``Channel(bus, name)``.

    ``connect()`` plays the ``local`` role (receives what is sent to ``local``, sends
    to ``remote``); ``listen()`` plays ``remote``. Receive by iterating
    (``async for delivery in channel``; it ends on disconnect or end) or with a
    ``handler`` given to ``connect``/``listen``. Without a handler, deliveries wait for
    the iteration (at most ``prefetch`` are buffered, then reading pauses; control
    signals behind them wait too, in order). Observe ``channel.events``: ``connected``,
    ``remote_connected``, ``disconnected``, ``remote_disconnected``, ``message`` (the
    delivery in ``details["delivery"]``, a notification: events may be dropped for a
    slow subscriber, deliveries never are), ``ended`` (``details["by"]`` is ``local``
    or ``remote``) and ``error``.

    In at-least-once mode a delivery stays pending until acked (``delivery.ack()`` or
    :meth:`ack`); those of an end that died are redelivered to the next end that
    connects with the same role, after the visibility timeout.

    Args:
        bus: a connected bus.
        name: the channel name: a queue name short enough that ``<name>:to:<role>``
            is one too (200 characters).
        local: the role of the end that calls ``connect()``.
        remote: the role of the end that calls ``listen()``.
        ttl: seconds the channel's queues survive after both ends detached
            (default ``BusSettings.default_ttl``).
    """

    def __init__(
        self,
        bus: BusContext,
        name: str,
        *,
        local: str = "local",
        remote: str = "remote",
        ttl: float | None = None,
    ) -> None:
        validate_name(name)
        validate_role(local)
        validate_role(remote)
        if local == remote:
            raise InvalidNameError(remote, "the two roles of a channel must differ")
        longest = len(name) + len(QUEUE_INFIX) + max(len(local), len(remote))
        if longest > MAX_NAME_LENGTH:
            raise InvalidNameError(name, f"channel name plus role exceed {MAX_NAME_LENGTH}")
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be positive")
        super().__init__(name, local, remote, ttl)
        self._bus = bus
        self.tracing = bus.tracing
        self._inbound: Queue | None = None
        self._outbound: Queue | None = None
        self._consumer: Consumer | None = None
        self._pump: asyncio.Task[None] | None = None
        self._holding: Delivery | None = None

    def __repr__(self) -> str:
        return f"<Channel {self.name!r} role={self.role!r} {self._state.value}>"

    # -- connecting -------------------------------------------------------------------

    async def _connect_end(self, listen: bool, options: EndOptions) -> None:
        inbound = Queue(self._bus, channel_queue_name(self.name, self.role))
        outbound = Queue(self._bus, channel_queue_name(self.name, self.peer_role))
        try:
            await asyncio.gather(inbound.attach(ttl=self.ttl), outbound.attach(ttl=self.ttl))
            consumer = inbound.consume(
                options.mode,
                prefetch=options.prefetch,
                visibility_timeout=options.visibility_timeout,
                from_id=options.from_id,
            )
            await consumer.start()
            await outbound.push(b"", headers={CONTROL_HEADER: "connect"})
        except BaseException:
            await asyncio.gather(inbound.detach(), outbound.detach(), return_exceptions=True)
            raise
        self._inbound, self._outbound, self._consumer = inbound, outbound, consumer

    def _start_receiving(self) -> None:
        assert self._consumer is not None, "connected"
        self._pump = asyncio.create_task(
            self._pump_loop(self._consumer), name=f"busmq-channel {self.name}:{self.role}"
        )

    # -- sending ----------------------------------------------------------------------

    async def send(self, message: Payload, *, headers: Mapping[str, str] | None = None) -> int:
        """Send a message to the peer; returns its id in the peer's queue.

        Raises:
            ChannelEndedError: the channel has ended (here or at the peer).
            ChannelStateError: this end is not connected (see :meth:`send_to`).
            InvalidMessageError: the message cannot be encoded, or uses a reserved
                ``busmq-`` header.
        """
        check_headers(headers)
        self._require_connected()
        assert self._outbound is not None, "connected"
        try:
            return await self._outbound.push(message, headers=headers)
        except QueueNotFoundError:
            raise self._peer_queue_gone() from None

    async def send_encoded(
        self, messages: Sequence[EncodedMessage], *, request_id: str | None = None
    ) -> PushResult:
        """Send already encoded messages to the peer atomically, in order (sizes are the
        caller's to check); ``request_id`` makes a retry idempotent, as for
        :meth:`Queue.push_encoded`. Raises as :meth:`send`."""
        check_encoded_headers(messages)
        self._require_connected()
        assert self._outbound is not None, "connected"
        try:
            return await self._outbound.push_encoded(messages, request_id=request_id)
        except QueueNotFoundError:
            raise self._peer_queue_gone() from None

    async def send_to(
        self, role: str, message: Payload, *, headers: Mapping[str, str] | None = None
    ) -> int:
        """Push a message to the queue of ``role`` without connecting; returns its id.

        The queue is created if needed, so the message waits for an end of that role
        (until the channel's ttl runs out with no end attached).
        """
        check_headers(headers)
        self._check_send_to(role)
        if self._state is ChannelState.CONNECTED and role == self.peer_role and self._outbound:
            return await self.send(message, headers=headers)
        async with Queue(self._bus, channel_queue_name(self.name, role)) as queue:
            return await queue.push(message, headers=headers)

    # -- receiving --------------------------------------------------------------------

    async def _ack(self, ids: list[int]) -> int:
        assert self._inbound is not None, "connected once"
        return await self._inbound.ack(*ids)

    async def _pump_loop(self, consumer: Consumer) -> None:
        settle = self._settler(consumer) if consumer.mode is Mode.AT_LEAST_ONCE else None
        try:
            async for raw in consumer:
                # nack(delay=...) and reject() go to the consumer (the end's own queue
                # and its dead letters, "<queue>:dead").
                delivery = Delivery(
                    raw.message, raw.delivery_count, settle, raw._control, raw._forward
                )
                # Neither in the consumer nor in the inbox while the pump holds it: a
                # disconnect must give it back too.
                self._holding = delivery
                control = raw.headers.get(CONTROL_HEADER)
                if control is None:
                    await self._deliver(delivery)
                    self._holding = None
                    continue
                await self._settle_quietly(delivery, ack=True)
                self._holding = None
                if control == "end":
                    await self._ended_by_peer()
                    return
                if control in ("connect", "disconnect"):
                    self._peer_signal(control == "connect")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("channel %s stopped receiving: %s", self.name, exc)
            self.events.emit(Event("error", self.name, error=exc))
        if self._state is ChannelState.CONNECTED and self._pump is asyncio.current_task():
            # The queue went away under us (closed elsewhere, or expired in an outage).
            self._pump = None
            await self._teardown()
            self._emit("disconnected", reason="lost")

    def _settler(self, consumer: Consumer) -> Callable[[int, bool], Awaitable[None]]:
        async def settle(message_id: int, ack: bool) -> None:
            if self._state is ChannelState.ENDED:
                return  # the queue is gone; there is nothing left to settle
            await consumer.settle_one(message_id, ack)

        return settle

    # -- disconnecting and ending --------------------------------------------------------

    async def disconnect(self, *, release_unacked: bool = False) -> None:
        """Tell the peer, stop receiving and detach both queues; messages keep coming
        into this end's queue and wait for the next ``connect``/``listen``.

        Deliveries already fetched: at-most-once ones stay available to the iteration
        (it drains them, then ends) or go through the handler first; at-least-once
        ones not yet handed out are given back for prompt redelivery, and a handler
        still running is cancelled (its delivery given back too). Handed-out
        deliveries not acked come back after the visibility timeout, or at once with
        ``release_unacked`` (for an end whose reader is gone, e.g. a closed gRPC
        stream).
        """
        async with self._lock:
            if self._state is not ChannelState.CONNECTED:
                return
            consumer = self._consumer
            if self._outbound is not None:
                try:
                    await self._outbound.push(b"", headers={CONTROL_HEADER: "disconnect"})
                except BusError as exc:
                    log.info("channel %s: could not tell the peer: %s", self.name, exc)
            await self._stop_receiving(drain=self._mode is Mode.AT_MOST_ONCE)
            await self._teardown()
            if self._ended():
                return  # the peer's ``end`` came in while this end drained
            if release_unacked and consumer is not None and consumer.mode is Mode.AT_LEAST_ONCE:
                try:
                    await consumer.release_pending()
                except BusError as exc:
                    log.info("channel %s: could not release deliveries: %s", self.name, exc)
        self._emit("disconnected", reason="local")

    async def end(self) -> None:
        """End the channel for both ends: tell the peer, delete this end's queue and
        leave the peer's to the peer (it deletes it on taking the ``end``).

        Without a prior ``connect``/``listen`` this end is taken to be ``local``.
        Idempotent; afterwards every operation raises :class:`ChannelEndedError`.
        """
        async with self._lock:
            if self._state is ChannelState.ENDED:
                return
            await self._stop_receiving(drain=False, give_back=False)
            inbound = self._inbound or Queue(self._bus, channel_queue_name(self.name, self.role))
            outbound = self._outbound or Queue(
                self._bus, channel_queue_name(self.name, self.peer_role)
            )
            self._state = ChannelState.ENDED
            try:
                await outbound.attach(ttl=self.ttl)
                await outbound.push(b"", headers={CONTROL_HEADER: "end"})
                await inbound.close()
            finally:
                await outbound.detach()
                await self._teardown()
        self._emit("ended", by="local")

    async def _remove_end(self) -> None:
        self._pump = None
        # Both queues go: ours holds nothing more to read, the peer already left its own.
        for queue in (self._inbound, self._outbound):
            if queue is not None:
                try:
                    await queue.close()
                except BusError as exc:
                    log.info("channel %s: could not delete %s: %s", self.name, queue.name, exc)
        await self._teardown()

    async def _stop_receiving(self, *, drain: bool, give_back: bool = True) -> None:
        pump, self._pump = self._pump, None
        consumer = self._consumer
        if pump is None or consumer is None:
            return
        if drain:
            # Let the pump hand out what the consumer already fetched (at-most-once
            # messages are gone from Redis once read) without waiting for the app.
            consumer.stop()
            self._inbox.set_unbounded()
            done, _ = await asyncio.wait({pump}, timeout=self._drain_seconds)
            if done:
                return
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
        holding, self._holding = self._holding, None
        if consumer.mode is not Mode.AT_LEAST_ONCE or not give_back:
            return
        leftovers = self._inbox.take_all() + ([holding] if holding is not None else [])
        if leftovers:
            try:
                await consumer.nack([d.id for d in leftovers])
            except BusError as exc:
                log.info("channel %s: could not give back deliveries: %s", self.name, exc)

    def _ended(self) -> bool:
        # A method, not an inline check, so that type narrowing does not assume the
        # state is unchanged across awaits.
        return self._state is ChannelState.ENDED

    @property
    def _drain_seconds(self) -> float:
        return self._bus.settings.block_seconds + _DISCONNECT_DRAIN_SECONDS

    async def _teardown(self) -> None:
        """Close the consumer, detach the queues and end the iteration."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.close()
        for queue in (self._inbound, self._outbound):
            if queue is not None and queue.attached:
                try:
                    await queue.detach()
                except BusError as exc:
                    log.info("channel %s: could not detach %s: %s", self.name, queue.name, exc)
        self._outbound = None
        if self._state is ChannelState.CONNECTED:
            self._state = ChannelState.DISCONNECTED
        self.remote_connected = False
        self._inbox.close()
