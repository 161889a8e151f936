"""Consumers: deliver a queue's messages in one of the three modes, local or federated.

A consumer is an async iterator of :class:`~busmq.message.Delivery` and an async
context manager. This module holds what every consumer does whatever feeds it: the
arguments, the hand-over of batches from a reader task to the iteration through a
bounded buffer (memory stays bounded by about three batches of ``prefetch``, and a slow
iteration slows the reads), acks batched per loop tick, stopping and closing with what
was read ahead, and the events. Where the deliveries come from is a
:class:`ConsumerReader`: a local queue's Redis reads (:mod:`busmq.local_reader`) or a
remote queue's ``Consume`` stream through the gateway
(:mod:`busmq.federation.consume_stream`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .acks import AckBatcher
from .consuming import Mode, check_consume_arguments, handle_each
from .controls import RetryPolicy, Settlement
from .errors import BusClosedError, BusError, UnknownMessageError
from .events import Event, EventHub
from .message import Delivery, ForwardTarget
from .notifier import WakeUp

if TYPE_CHECKING:
    from .tracing import Tracing

log = logging.getLogger(__name__)


class ConsumerHost(Protocol):
    """What a consumer needs of its queue object (local or federated)."""

    name: str
    events: EventHub[Event]
    consumed: int
    """Messages this process's consumers of the queue handed out."""
    _consumers: set[Consumer]
    """The queue object's consumers that started and have not closed."""
    tracing: Tracing | None
    """Trace propagation: :meth:`Consumer.run` handles each delivery in a span."""

    async def ack(self, *ids: int) -> int: ...


class ConsumerReader(Protocol):
    """Where a consumer's deliveries come from. Its methods get the consumer they work
    for; a reader keeps no reference to it."""

    reconnects: int
    stops_at_once: bool
    """``stop()`` ends the reads at once (a stream) rather than after the read in flight;
    at-least-once deliveries read ahead are then dropped (the source redelivers them)."""

    async def open(self, consumer: Consumer) -> dict[str, Any]:
        """Begin (``start()``): refusals raise here. Returns what the ``consuming``
        event says besides the mode."""

    async def read(self, consumer: Consumer) -> None:
        """Hand batches over with :meth:`Consumer.hand_over` until stopped or done;
        raise a :class:`BusError` that ends the iteration."""

    async def quiesce(self, consumer: Consumer) -> None:
        """``close()``: let a read in flight finish, if worth waiting for."""

    async def finish(self, consumer: Consumer, leftovers: list[int]) -> None:
        """``close()``, after the reads ended: settle what was read and not handed out
        (``leftovers``, ids) and leave the source."""

    async def flush_acks(self, consumer: Consumer, ids: list[int]) -> list[int]:
        """Acknowledge ``ids``; the ids that were not pending."""

    async def ack_upto(self, consumer: Consumer, message_id: int) -> int: ...

    async def nack(self, consumer: Consumer, ids: Sequence[int]) -> None: ...

    async def settle(
        self, consumer: Consumer, ids: Sequence[int], settlement: Settlement
    ) -> list[int]: ...

    async def release_pending(self, consumer: Consumer, *, unless_ordered: bool) -> int: ...

    async def forward(
        self,
        consumer: Consumer,
        message_id: int,
        target: ForwardTarget,
        items: Sequence[Any],
        settle: bool,
    ) -> bool:
        """Store ``items`` in ``target`` (and ack ``message_id`` if ``settle``), exactly
        once."""
        ...


class ReadBatch(list[Delivery]):
    """A batch handed over by a reader, with the time (``time.monotonic()``) at which an
    at-least-once delivery of it lapses: its visibility timeout runs out, and any consumer
    may claim it."""

    __slots__ = ("lapses_at",)

    lapses_at: float


@dataclass(frozen=True)
class End:
    """The end of the iteration, with the error that ended it."""

    error: BaseException | None = None


class Consumer:
    """Iterate with ``async for delivery in consumer``; stop with :meth:`stop`.

    Create through :meth:`Queue.consume` (or a federated queue's). Fatal errors (the
    queue was closed, a mode conflict) are raised from the iteration; outages are
    retried with backoff and reported as ``error`` events on the queue.

    Attributes:
        name: this consumer's name in its queue's consumer group (for a federated
            queue: the gateway's consumer of the current stream, which changes when
            the stream is reopened).
        delivered: deliveries handed out.
        reconnects: how many times a federated consumer's stream was reopened after a
            break (0 for a local queue, whose reads ride through outages).
    """

    def __init__(
        self,
        queue: ConsumerHost,
        mode: Mode,
        reader: ConsumerReader,
        *,
        name: str = "",
        max: int | None,
        from_id: int,
        prefetch: int,
        visibility_timeout: float,
        max_deliveries: int | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        check_consume_arguments(
            mode,
            max=max,
            from_id=from_id,
            prefetch=prefetch,
            visibility_timeout=visibility_timeout,
            max_deliveries=max_deliveries,
            retry_policy=retry_policy,
        )
        self.queue = queue
        self.mode = mode
        self.max = max
        self.from_id = from_id
        self.prefetch = prefetch
        self.visibility_timeout = visibility_timeout
        self.max_deliveries = max_deliveries
        self.retry_policy = retry_policy
        self.name = name
        self.delivered = 0
        self.reader = reader
        self._buffer: asyncio.Queue[list[Delivery] | End] = asyncio.Queue(maxsize=1)
        self._batch: list[Delivery] = []
        self._index = 0
        # At-least-once: a delivery whose visibility timeout ran out in the read-ahead is
        # not handed out (another consumer may have claimed it: handled twice at once, out
        # of order per key); it comes again through a claim. This consumer's own claims
        # renew what it holds read ahead (see renewed).
        self._lapses = mode is Mode.AT_LEAST_ONCE
        self._lapses_at = float("inf")
        self._last: Delivery | None = None  # the last handed out of an earlier batch
        self._unbuffered: list[Delivery] = []  # handed over, waiting for room
        self._dropped: list[int] = []  # fetched, not handed out, taken by stop()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._closing = False
        self._finished = False
        self._acks = AckBatcher(queue.name, self._flush_acks)
        self.wake = WakeUp()  # a local reader's, from the notifier, once reading
        self._give_backs = 0  # the wake-up's give-backs seen (see _give_back_read_ahead)
        self._ended = asyncio.Event()  # set by close()

    def __repr__(self) -> str:
        return f"<Consumer {self.queue.name!r} {self.mode.value} {self.name or '-'}>"

    @property
    def reconnects(self) -> int:
        return self.reader.reconnects

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def stopping(self) -> bool:
        """``stop()`` or ``close()`` was called: readers end their loop."""
        return self._stopping

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Begin fetching (done by ``async with`` or iteration). Refusals (a mode
        conflict, an unknown queue, bad credentials) raise here."""
        if self._task is not None:
            return
        if self._stopping:
            raise BusClosedError("consumer was stopped")
        details = {"mode": self.mode.value, **await self.reader.open(self)}
        self.queue._consumers.add(self)
        self._task = asyncio.create_task(self._read(), name=f"busmq-consumer {self.name}")
        self.queue.events.emit(Event("consuming", self.queue.name, details=details))

    async def _read(self) -> None:
        end = End()
        try:
            await self.reader.read(self)
        except asyncio.CancelledError:
            if not self._stopping or self._closing:
                raise
            # Stopped at once (a stream): what was handed over and is waiting for room
            # is handed out still (at-least-once: stop() emptied it first).
            if self._unbuffered:
                await self._buffer.put(self._unbuffered)
                self._unbuffered = []
        except Exception as exc:  # BusError, or a reader's bug: it ends the iteration
            end = End(exc)
        # Not reached when cancelled by close(), which ends the iteration itself.
        await self._buffer.put(end)

    async def hand_over(self, batch: list[Delivery], lapses_at: float | None = None) -> None:
        """For readers: queue ``batch`` (just read) for the iteration, waiting for room.
        At-least-once, its deliveries lapse a visibility timeout from now, or earlier at
        ``lapses_at`` (``time.monotonic()``) when the reader knows they were read before
        (a remote reader: by the gateway)."""
        if self._lapses:
            batch = ReadBatch(batch)
            batch.lapses_at = time.monotonic() + self.visibility_timeout
            if lapses_at is not None and lapses_at < batch.lapses_at:
                batch.lapses_at = lapses_at
        self._unbuffered = batch
        await self._buffer.put(batch)
        self._unbuffered = []

    def renewed(self, ids: set[int], at: float) -> None:
        """For readers: this consumer's claim, made at ``at``, took ``ids`` again while they
        waited in its read-ahead (their leases run from then): a batch whose every
        delivery not yet handed out is among them lapses a visibility timeout later."""
        lapses_at = at + self.visibility_timeout
        rest = self._batch[self._index :]
        if rest and all(d.id in ids for d in rest):
            self._lapses_at = max(self._lapses_at, lapses_at)
        for item in [*self._buffered(), self._unbuffered]:
            if isinstance(item, ReadBatch) and item and all(d.id in ids for d in item):
                item.lapses_at = max(item.lapses_at, lapses_at)

    def stop(self) -> None:
        """Stop fetching; iteration ends after the deliveries already fetched (a
        federated at-least-once consumer drops those instead, and ``close()`` gives
        them back)."""
        if self._stopping:
            return
        self._stopping = True
        if self.reader.stops_at_once and self._task is not None:
            if self.mode is Mode.AT_LEAST_ONCE:
                self._dropped, _ = self.take_read_ahead(keep_end=True)  # for close()
            self._task.cancel()

    async def close(self) -> None:
        """Stop at once and release what was fetched but not handed out.

        At-least-once deliveries not yet handed out are given back for prompt
        redelivery. At-most-once messages are removed from their queue when read, so
        those not yet handed out are lost: they are counted in a ``dropped`` event. To
        lose nothing, call :meth:`stop` and finish the iteration instead (it drains).
        """
        self.stop()
        self._closing = True
        if self._task is not None:
            await self.reader.quiesce(self)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        leftovers, _ = self.take_read_ahead()
        leftovers = self._dropped + leftovers
        self._finished = True
        self._ended.set()  # an iteration held back by an outage (_before_hand_out)
        self._buffer.put_nowait(End())  # wakes an iteration blocked in another task
        await self._acks.drain()
        await self.reader.finish(self, leftovers)
        queue = self.queue
        if self.mode is Mode.AT_MOST_ONCE and leftovers:
            queue.events.emit(Event("dropped", queue.name, details={"count": len(leftovers)}))
        if self in queue._consumers:
            queue._consumers.discard(self)
            queue.events.emit(Event("stopped", queue.name, details={"consumer": self.name}))

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- iteration ------------------------------------------------------------------

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Delivery:
        wake = self.wake
        if wake.give_backs != self._give_backs or not wake.serving.is_set():
            await self._before_hand_out()
        if self._index >= len(self._batch) or (self._lapses and self._lapsed()):
            await self._refill()
        delivery = self._batch[self._index]
        self._index += 1
        self.delivered += 1
        self.queue.consumed += 1
        return delivery

    async def next_batch(self) -> list[Delivery]:
        """Every delivery available now (at least one), waiting for the next read if
        there is none; raises ``StopAsyncIteration`` at the end, like iteration.

        For relays (such as the gateway) that move deliveries in bulk: one await per
        read instead of one per message. Mixing it with iteration is fine."""
        wake = self.wake
        if wake.give_backs != self._give_backs or not wake.serving.is_set():
            await self._before_hand_out()
        if self._index >= len(self._batch) or (self._lapses and self._lapsed()):
            await self._refill()
        batch = self._batch[self._index :]
        self._index = len(self._batch)
        self.delivered += len(batch)
        self.queue.consumed += len(batch)
        return batch

    async def wait_ready(self) -> None:
        """Wait until :meth:`next_batch` has deliveries to return at once; raises
        ``StopAsyncIteration`` at the end. Cancelling the wait loses nothing: a batch it
        took from the read-ahead is the current one, not handed out yet."""
        if self._index >= len(self._batch) or (self._lapses and self._lapsed()):
            await self._refill()

    @property
    def lapses_at(self) -> float | None:
        """At-least-once: when (``time.monotonic()``) the deliveries of the current batch
        lapse, those :meth:`next_batch` returned last among them; else ``None``."""
        if not self._lapses or self._lapses_at == float("inf"):
            return None
        return self._lapses_at

    def _lapsed(self) -> bool:
        """Whether the rest of the current batch lapsed in the read-ahead (at-least-once);
        if so it is dropped, counted in a ``lapsed`` event."""
        if time.monotonic() < self._lapses_at:
            return False
        count = len(self._batch) - self._index
        if count:
            if self._index:
                self._last = self._batch[self._index - 1]
            self._batch, self._index = [], 0
            details = {"consumer": self.name, "count": count}
            self.queue.events.emit(Event("lapsed", self.queue.name, details=details))
        return True

    async def _refill(self) -> None:
        if self._finished:
            raise StopAsyncIteration
        if self._task is None:
            await self.start()
        while True:
            item: list[Delivery] | End = []
            while not item:  # a batch taken back while the reader was queueing it is empty
                item = await self._buffer.get()
            if isinstance(item, End):
                self._finished = True
                if item.error is not None:
                    raise item.error
                raise StopAsyncIteration
            if self._index:
                self._last = self._batch[self._index - 1]
            self._batch, self._index = item, 0
            self._lapses_at = item.lapses_at if isinstance(item, ReadBatch) else float("inf")
            if not (self._lapses and self._lapsed()):
                return

    def last_handed_out(self) -> Delivery | None:
        """The last delivery handed out, if any."""
        return self._batch[self._index - 1] if self._index else self._last

    async def _before_hand_out(self) -> None:
        """The queue's shard is offline, or its consumers were told to give back.

        At-least-once, nothing is handed out while the shard is offline: the probe that
        brings it back first says whether the master moved, and if it did the read-ahead
        is given back instead (a delivery handed out during the outage could run beside
        a redelivery, by the new master, of an earlier message of its key). Deliveries
        handed out then could not be acked before the shard is back anyway."""
        serving = self.wake.serving
        if self.mode is Mode.AT_LEAST_ONCE and not serving.is_set() and not self._finished:
            waits = [asyncio.ensure_future(e.wait()) for e in (serving, self._ended)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        if self.wake.give_backs != self._give_backs:
            await self._give_back_read_ahead()

    async def _give_back_read_ahead(self) -> None:
        """The queue was paused, or its shard's master moved: give back what was fetched
        and not handed out (at-least-once; at-most-once reads removed it, so it is handed
        out still). After a failover the new master may not have seen the reads that
        fetched it, nor the acks before them: handed out, a delivery could run beside a
        redelivery of an earlier message of its key."""
        if self.mode is not Mode.AT_LEAST_ONCE:
            self._give_backs = self.wake.give_backs
            return
        while True:
            # Counted on the wake-up too, so that the reader gives back a read in flight
            # now (it may be a lean one, which would hand out newer messages ahead of
            # these); what a read finished meanwhile handed over is taken the next time.
            self.wake.give_backs += 1
            self._give_backs = self.wake.give_backs
            ids, _ = self.take_read_ahead(keep_end=True)
            if not ids:
                return
            await self.give_back(ids, "fetched before the queue paused or its master moved")

    def take_read_ahead(self, *, keep_end: bool = False) -> tuple[list[int], End | None]:
        """The ids fetched and not handed out, in the order they were read (the current
        batch's rest, the buffered batch, the batch the reader is queueing), taken out
        of the consumer; and the end of the iteration if it was buffered (left in the
        buffer with ``keep_end``)."""
        ids = [d.id for d in self._batch[self._index :]]
        if self._index:
            self._last = self._batch[self._index - 1]
        self._batch, self._index = [], 0
        end: End | None = None
        while not self._buffer.empty():
            item = self._buffer.get_nowait()
            if isinstance(item, End):
                end = item
            else:
                ids.extend(d.id for d in item)
        # The reader may be queueing this batch: emptied, it is skipped (see _refill).
        ids.extend(d.id for d in self._unbuffered)
        self._unbuffered.clear()
        if end is not None and keep_end:
            self._buffer.put_nowait(end)
        return ids, end

    def read_ahead_ids(self) -> set[int]:
        """The ids fetched and not handed out (left where they are)."""
        ids = {d.id for d in self._batch[self._index :]}
        ids.update(d.id for d in self._unbuffered)
        for item in self._buffered():
            if not isinstance(item, End):
                ids.update(d.id for d in item)
        return ids

    def _buffered(self) -> list[list[Delivery] | End]:
        """What waits in the buffer, left where it is."""
        items = [self._buffer.get_nowait() for _ in range(self._buffer.qsize())]
        for item in items:
            self._buffer.put_nowait(item)
        return items

    async def give_back(self, ids: list[int], why: str) -> None:
        """Nack ``ids`` for prompt redelivery; a failure is logged (they come back
        after the visibility timeout instead)."""
        try:
            await self.nack(ids)
        except BusError as exc:
            log.warning("could not give back %d deliveries %s: %s", len(ids), why, exc)

    async def run(self, handler: Callable[[Delivery], Awaitable[Any]]) -> None:
        """Call ``handler`` for every delivery until stopped. In at-least-once mode a
        delivery is acked when the handler returns and nacked when it raises."""
        async with self:
            await handle_each(self, handler, self.queue.name, self.queue.tracing)

    # -- acknowledgements (at-least-once) ----------------------------------------------

    async def ack(self, ids: Sequence[int]) -> int:
        """Acknowledge deliveries; see :meth:`Queue.ack`."""
        return await self.queue.ack(*ids)

    async def ack_upto(self, message_id: int) -> int:
        """Acknowledge every delivery of this consumer with an id up to ``message_id``.
        Returns how many were pending and are now acknowledged."""
        self._require_acks()
        return await self.reader.ack_upto(self, message_id)

    async def nack(self, ids: Sequence[int]) -> None:
        """Give deliveries back as they are (no failure counted, no retry delay): the
        next read of any consumer redelivers them, ahead of messages stored after them."""
        self._require_acks()
        await self.reader.nack(self, ids)

    async def release_pending(self, *, unless_ordered: bool = False) -> int:
        """Give back every delivery still pending for this consumer (handed out and not
        acked), for prompt redelivery to any consumer; returns how many. For a consumer
        whose deliveries went to a process that is gone (e.g. a closed gRPC stream).

        With ``unless_ordered``, nothing is given back if the queue is ordered per key:
        for deliveries whose reader may still be handling them (a broken stream is not
        a dead client), since a redelivery beside such a handling would run two
        messages of a key at once. Their visibility timeout brings them back."""
        self._require_acks()
        return await self.reader.release_pending(self, unless_ordered=unless_ordered)

    async def settle(self, ids: Sequence[int], settlement: Settlement) -> list[int]:
        """Retry deliveries (after ``settlement.delay``, else as the retry policy says,
        else at once) or reject them (``settlement.reject``) to the dead-letter queue; a
        retry past ``max_deliveries`` dead-letters instead. Whichever consumer received
        them. Returns the ids that were not pending."""
        self._require_acks()
        return await self.reader.settle(self, ids, settlement)

    def _require_acks(self) -> None:
        if self.mode is not Mode.AT_LEAST_ONCE:
            raise BusError(f"acks apply to at-least-once consumers, not {self.mode.value}")

    async def _flush_acks(self, ids: list[int]) -> list[int]:
        return await self.reader.flush_acks(self, ids)

    async def settle_one(self, message_id: int, ack: bool) -> None:
        """A delivery's ``ack()`` (batched with the others of the tick) or ``nack()``."""
        if ack:
            await self._acks.ack(message_id)
        else:
            await self.settle_other(message_id, Settlement())

    async def settle_other(self, message_id: int, settlement: Settlement) -> None:
        """A delivery's ``nack(delay=...)``, ``nack(error=...)`` or ``reject()``."""
        unknown = await self.settle([message_id], settlement)
        if unknown:
            raise UnknownMessageError(self.queue.name, unknown)

    async def forward(
        self, message_id: int, target: ForwardTarget, items: Sequence[Any], settle: bool
    ) -> bool:
        """A delivery's ``forward()`` (see :meth:`Delivery.forward`); without ``settle``
        the delivery stays pending (a service request, settled by its reply)."""
        return await self.reader.forward(self, message_id, target, items, settle)

    def acking(self, message_id: int) -> bool:
        """Whether an ack of ``message_id`` is waiting or on its way."""
        return message_id in self._acks
