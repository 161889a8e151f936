"""Consumers: deliver a queue's messages in one of the three modes.

A consumer is an async iterator of :class:`~busmq.message.Delivery` and an async
context manager. A reader task fetches batches of up to ``prefetch`` messages and hands
them over through a one-slot buffer, so memory stays bounded by about two batches and a
slow iteration slows the reads. Reads never block in Redis: when a queue is empty the
reader waits for a wake-up from the shard's :class:`~busmq.notifier.Notifier`.

- at-most-once: ``XREADGROUP ... NOACK`` in the read script, which deletes what it
  read. Each message goes to one consumer and is gone.
- at-least-once: ``XREADGROUP`` in the read script; a delivery stays pending until
  acked. Every ``claim_interval`` the consumer takes over deliveries that have been
  pending longer than ``visibility_timeout`` (their consumer died or stalled), with a
  delivery count, or dead-letters them past ``max_deliveries``.
- replay: ``XREAD`` from an id; nothing is removed, every reader sees every message.

The read script of the destructive modes also applies the processing controls (pause,
rate limits, due retries and delayed messages, expiry; see :mod:`busmq.controls`) and
says how long until something is due, which bounds the consumer's idle wait. It also
says when none of that applies to the queue; the consumer then reads with a plain
``XREADGROUP`` (the *lean* read: no script, so Redis does not copy each entry into Lua
and back) until the notifier marks its wake-up ``recheck``: a control changed, a delayed
push or a retry was scheduled (a ``c`` publication) or the notifier resubscribed; and
at least every few seconds regardless (``_LEAN_SECONDS``, jittered), in case a change
went unannounced. A queue without controls so pays nothing for them; a change reaches a
consumer after at most the one read it had in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import consumer_group
from .acks import AckBatcher
from .consuming import LATEST, Mode, check_consume_arguments, handle_each, wait_for_wakeup
from .controls import RetryPolicy, Settlement, settle
from .errors import (
    BusClosedError,
    BusError,
    BusUnavailableError,
    ModeConflictError,
    UnknownMessageError,
)
from .events import Event, EventHub
from .message import Delivery, decode_raw, int_to_stream_id
from .notifier import WakeUp
from .queue_store import QueueStore
from .reads import GroupMissing, read_full, read_lean, read_replay

log = logging.getLogger(__name__)


_LEAN_SECONDS = 5.0  # longest run of lean reads between two full ones


class ConsumerHost(Protocol):
    """What a consumer needs of its queue object (a :class:`~busmq.queue.Queue`)."""

    name: str
    events: EventHub[Event]
    consumed: int
    """Messages this process's consumers of the queue handed out."""
    store: QueueStore
    _consumers: set[Consumer]
    """The queue object's consumers that started and have not closed."""

    async def ack(self, *ids: int) -> int: ...


@dataclass(frozen=True)
class _End:
    error: BaseException | None = None


class Consumer:
    """Iterate with ``async for delivery in consumer``; stop with :meth:`stop`.

    Create through :meth:`Queue.consume`. Fatal errors (the queue was closed, a mode
    conflict) are raised from the iteration; Redis outages are retried with backoff
    and reported as ``error`` events on the queue.
    """

    _ids = itertools.count(1)

    def __init__(
        self,
        queue: ConsumerHost,
        mode: Mode,
        *,
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
        self._store = store = queue.store
        self.mode = mode
        self.max = max
        self.prefetch = prefetch
        self.visibility_timeout = visibility_timeout
        self.max_deliveries = max_deliveries
        self.retry_policy = retry_policy
        self.name = f"{store.bus.client_id}:{next(self._ids)}"
        self.delivered = 0
        self._from_id = from_id
        self._fetched = 0
        self._next_claim = 0.0  # loop time of the next claim (at-least-once)
        self._buffer: asyncio.Queue[list[Delivery] | _End] = asyncio.Queue(maxsize=1)
        self._batch: list[Delivery] = []
        self._index = 0
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False
        self._finished = False
        self._acks = AckBatcher(queue.name, self._flush_acks)
        self._not_reading = asyncio.Event()  # clear while a read is in flight
        self._not_reading.set()
        self._unbuffered: list[Delivery] = []  # read, not yet in the buffer
        self._cursor = "0-0"  # replay: the last stream id read
        self._due_in: float | None = None  # seconds until something is due (read script)
        self._wake = WakeUp()  # the notifier's, once reading
        self._pauses = 0  # the wake-up's pauses seen (see _give_back_read_ahead)
        self._lean = False  # the last full read said no control applies (see the module)
        self._lean_until = 0.0  # loop time after which the next read is a full one

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Fix the queue's mode and begin fetching (done by ``async with`` or iteration)."""
        if self._reader is not None:
            return
        if self._stopping:
            raise BusClosedError("consumer was stopped")
        queue = self.queue
        current, last_id = await self._store.prepare_consumer(self.mode.family)
        if current != self.mode.family:
            raise ModeConflictError(queue.name, current, self.mode.family)
        if self.mode is Mode.REPLAY:
            start = last_id + 1 if self._from_id == LATEST else max(self._from_id, 1)
            self._cursor = int_to_stream_id(start - 1)
        queue._consumers.add(self)
        self._store.wakes.add(self._wake)
        self._reader = asyncio.create_task(self._read_loop(), name=f"busmq-consumer {self.name}")
        queue.events.emit(Event("consuming", queue.name, details={"mode": self.mode.value}))

    def stop(self) -> None:
        """Stop fetching; iteration ends after the messages already fetched."""
        self._stopping = True

    async def close(self) -> None:
        """Stop at once and release what was fetched but not handed out.

        At-least-once deliveries not yet handed out are given back for prompt
        redelivery. At-most-once messages are removed from Redis when read, so those
        not yet handed out are lost: they are counted in a ``dropped`` event. To lose
        nothing, call :meth:`stop` and finish the iteration instead (it drains).
        """
        self.stop()
        if self._reader is not None:
            # What a read or claim in flight returns is already this consumer's in Redis
            # (at-most-once: removed): let it finish and give it back or count it with
            # the rest; but not wait out an outage (at-least-once: it comes back after
            # the visibility timeout).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._store.bus.settings.operation_timeout):
                    await self._not_reading.wait()
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        leftovers, _ = self._take_read_ahead()
        self._finished = True
        self._buffer.put_nowait(_End())  # wakes an iteration blocked in another task
        await self._acks.drain()
        if self.mode is Mode.AT_MOST_ONCE:
            try:
                await self._store.send_deferred()  # what it read leaves the stream now
            except BusError as exc:
                log.debug("could not send the deletes of %s: %s", self.name, exc)
        await self._release(leftovers)
        await self._leave_group()
        if self in self.queue._consumers:
            self.queue._consumers.discard(self)
            self._store.wakes.discard(self._wake)
            details = {"consumer": self.name}
            self.queue.events.emit(Event("stopped", self.queue.name, details=details))

    async def _leave_group(self) -> None:
        if self.mode is Mode.REPLAY or self._reader is None:
            return  # replay reads without the group; never started: never joined
        try:
            await consumer_group.leave(self._store, self.name)
        except BusError as exc:  # an idle consumer is forgotten later (claim.lua)
            log.debug("%s could not leave the group of %s: %s", self.name, self.queue.name, exc)

    async def _release(self, leftovers: list[int]) -> None:
        if self.mode is Mode.AT_LEAST_ONCE and leftovers:
            try:
                await self.nack(leftovers)
            except BusError as exc:
                log.warning("could not release %d deliveries: %s", len(leftovers), exc)
        elif self.mode is Mode.AT_MOST_ONCE and leftovers:
            self.queue.events.emit(
                Event("dropped", self.queue.name, details={"count": len(leftovers)})
            )

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- iteration ------------------------------------------------------------------

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Delivery:
        if self._wake.pauses != self._pauses:
            await self._give_back_read_ahead()
        if self._index >= len(self._batch):
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
        if self._wake.pauses != self._pauses:
            await self._give_back_read_ahead()
        if self._index >= len(self._batch):
            await self._refill()
        batch = self._batch[self._index :]
        self._index = len(self._batch)
        self.delivered += len(batch)
        self.queue.consumed += len(batch)
        return batch

    async def _refill(self) -> None:
        if self._finished:
            raise StopAsyncIteration
        if self._reader is None:
            await self.start()
        item: list[Delivery] | _End = []
        while not item:  # a batch given back while the reader was queueing it is empty
            item = await self._buffer.get()
        if isinstance(item, _End):
            self._finished = True
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        self._batch, self._index = item, 0

    async def _give_back_read_ahead(self) -> None:
        """The queue was paused: give back what was fetched and not handed out (at-least-
        once; at-most-once reads removed it from Redis, so it is handed out still)."""
        self._pauses = self._wake.pauses
        if self.mode is not Mode.AT_LEAST_ONCE:
            return
        ids, end = self._take_read_ahead()
        if end is not None:
            self._buffer.put_nowait(end)
        if ids:
            self._fetched -= len(ids)
            await self._give_back(ids, "fetched before the queue paused")

    def _take_read_ahead(self) -> tuple[list[int], _End | None]:
        """The ids fetched and not handed out, in the order they were read (the current
        batch's rest, the buffered batch, the batch the reader is queueing), taken out
        of the consumer; and the end of the iteration if it was buffered."""
        ids = [d.id for d in self._batch[self._index :]]
        self._batch, self._index = [], 0
        end: _End | None = None
        while not self._buffer.empty():
            item = self._buffer.get_nowait()
            if isinstance(item, _End):
                end = item
            else:
                ids.extend(d.id for d in item)
        # The reader may be queueing this batch: emptied, it is skipped (see _refill).
        ids.extend(d.id for d in self._unbuffered)
        self._unbuffered.clear()
        return ids, end

    async def _give_back(self, ids: list[int], why: str) -> None:
        try:
            await self.nack(ids)
        except BusError as exc:  # they come back after the visibility timeout instead
            log.warning("could not give back %d deliveries %s: %s", len(ids), why, exc)

    async def run(self, handler: Callable[[Delivery], Awaitable[Any]]) -> None:
        """Call ``handler`` for every delivery until stopped. In at-least-once mode a
        delivery is acked when the handler returns and nacked when it raises."""
        async with self:
            await handle_each(self, handler, self.queue.name)

    # -- acknowledgements (at-least-once) ----------------------------------------------

    async def ack(self, ids: Sequence[int]) -> int:
        """Acknowledge deliveries; see :meth:`Queue.ack`."""
        return await self.queue.ack(*ids)

    async def ack_upto(self, message_id: int) -> int:
        """Acknowledge every delivery of this consumer with an id up to ``message_id``.
        Returns how many were pending and are now acknowledged."""
        self._require_acks()
        store = self._store
        acked: int = await store.run_fast(
            lambda c: store.bus.scripts.call(
                c, "ack_upto", [store.keys.stream], [self.name, int_to_stream_id(message_id)]
            ),
            idempotent=True,
        )
        self._store.bus.counters.add("acked", self.queue.name, acked)
        return acked

    async def nack(self, ids: Sequence[int]) -> None:
        """Give deliveries back as they are (no failure counted, no retry delay): the
        next read of any consumer redelivers them, ahead of messages stored after them."""
        await self.settle(ids, Settlement(release=True))

    async def release_pending(self) -> int:
        """Give back every delivery still pending for this consumer (handed out and not
        acked), for prompt redelivery to any consumer; returns how many. For a consumer
        whose deliveries went to a process that is gone (e.g. a closed gRPC stream)."""
        self._require_acks()
        return await consumer_group.release_pending(self._store, self.name)

    def _require_acks(self) -> None:
        if self.mode is not Mode.AT_LEAST_ONCE:
            raise BusError(f"acks apply to at-least-once consumers, not {self.mode.value}")

    async def _settle(self, message_id: int, ack: bool) -> None:
        if ack:
            await self._acks.ack(message_id)
        else:
            await self._settle_other(message_id, Settlement())

    async def _settle_other(self, message_id: int, settlement: Settlement) -> None:
        unknown = await self.settle([message_id], settlement)
        if unknown:
            raise UnknownMessageError(self.queue.name, unknown)

    async def settle(self, ids: Sequence[int], settlement: Settlement) -> list[int]:
        """Retry deliveries (after ``settlement.delay``, else as the retry policy says,
        else at once) or reject them (``settlement.reject``) to the dead-letter queue; a
        retry past ``max_deliveries`` dead-letters instead. Whichever consumer received
        them. Returns the ids that were not pending."""
        self._require_acks()
        return await settle(
            self._store,
            self.name,
            ids,
            settlement,
            retry_policy=self.retry_policy,
            max_deliveries=self.max_deliveries,
        )

    async def _flush_acks(self, ids: list[int]) -> list[int]:
        return await self._store.ack(ids)

    # -- fetching -------------------------------------------------------------------

    async def _read_loop(self) -> None:
        shard = self._store.shard
        assert shard is not None, "start() locates the queue"
        wake = await shard.notifier.watch(self.queue.name)
        self._store.wakes.discard(self._wake)
        self._store.wakes.add(wake)
        self._wake = wake
        backoff = 0.05
        end = _End()
        try:
            while not self._stopping:
                count = self.prefetch
                if self.max is not None:
                    count = min(count, self.max - self._fetched)
                    if count <= 0:
                        break
                wake.clear()  # before reading, so a push during the read is not missed
                pauses = wake.pauses
                try:
                    batch = await self._claim_or_read(count)
                except BusUnavailableError as exc:
                    self.queue.events.emit(Event("error", self.queue.name, error=exc))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self._store.bus.settings.reconnect_backoff_max)
                    continue
                except GroupMissing:
                    await self._store.prepare_consumer(self.mode.family)
                    continue
                backoff = 0.05
                if batch and wake.pauses != pauses and self.mode is Mode.AT_LEAST_ONCE:
                    await self._give_back([d.id for d in batch], "read as the queue paused")
                    continue
                if batch:
                    self._fetched += len(batch)
                    self._store.bus.counters.delivered(self.queue.name, batch)
                    self._unbuffered = batch
                    await self._buffer.put(batch)
                    self._unbuffered = []
                if len(batch) < count:
                    # Drained: wait for a wake-up rather than make the empty read that
                    # would follow (a push during the read set ``wake`` already), or
                    # until something the read script reported is due.
                    idle = self._idle_seconds
                    if self._due_in is not None:
                        idle = min(idle, self._due_in)
                    await wait_for_wakeup(wake, idle, shard.notifier.tick)
        except Exception as exc:
            end = _End(exc)
        finally:
            await shard.notifier.unwatch(self.queue.name, wake)
        # Not reached when cancelled by close(), which ends the iteration itself.
        await self._buffer.put(end)

    async def _claim_or_read(self, count: int) -> list[Delivery]:
        # close() waits for a read in flight rather than cancel it (see there).
        self._not_reading.clear()
        try:
            return await self._claim_or_fetch(count)
        finally:
            self._not_reading.set()

    async def _claim_or_fetch(self, count: int) -> list[Delivery]:
        """At-least-once: overdue deliveries first, every claim interval and again at once
        after a full claim (more may be overdue); otherwise new messages."""
        if self.mode is Mode.AT_LEAST_ONCE:
            now = asyncio.get_running_loop().time()
            if now >= self._next_claim:
                claimed = await self._claim(count)
                full = len(claimed) == count
                self._next_claim = now if full else now + self._claim_interval
                if claimed:
                    return claimed
        return await self._fetch(count)

    @property
    def _claim_interval(self) -> float:
        return min(self.visibility_timeout / 2, self._store.bus.settings.block_seconds)

    @property
    def _idle_seconds(self) -> float:
        """Longest wait for a wake-up when the queue looked empty."""
        idle = self._store.bus.settings.block_seconds
        if self.mode is Mode.AT_LEAST_ONCE:
            idle = min(idle, self._claim_interval)
        return idle

    async def _fetch(self, count: int) -> list[Delivery]:
        if self.mode is Mode.REPLAY:
            return await self._fetch_replay(count)
        loop = asyncio.get_running_loop()
        noack = self.mode is Mode.AT_MOST_ONCE
        if self._lean and not self._wake.recheck and loop.time() < self._lean_until:
            entries = await read_lean(self._store, self.name, count, noack)
            self._due_in = None
            if noack:
                return [Delivery(decode_raw(eid, fields), 1, None) for eid, fields in entries]
            settle, control = self._settle, self._settle_other
            return [
                Delivery(decode_raw(eid, fields), 1, settle, control) for eid, fields in entries
            ]
        # Cleared before the read: a change announced while it runs marks it again.
        self._wake.recheck = False
        self._lean = False
        entries, retried, wait, self._lean = await read_full(self._store, self.name, count, noack)
        if self._lean:
            self._lean_until = loop.time() + _LEAN_SECONDS * (0.5 + random.random() / 2)
        self._due_in = None if wait < 0 else wait / 1000
        settle_one: Callable[[int, bool], Awaitable[None]] | None = None
        control_one: Callable[[int, Settlement], Awaitable[None]] | None = None
        if not noack:
            settle_one, control_one = self._settle, self._settle_other
        deliveries = [
            Delivery(decode_raw(eid, fields), int(times), settle_one, control_one)
            for eid, fields, times in retried
        ]
        deliveries.extend(
            Delivery(decode_raw(eid, fields), 1, settle_one, control_one) for eid, fields in entries
        )
        return deliveries

    async def _fetch_replay(self, count: int) -> list[Delivery]:
        entries, wait = await read_replay(self._store, self._cursor, count)
        self._due_in = None if wait < 0 else wait / 1000
        if not entries:
            return []
        last = entries[-1][0]
        self._cursor = last.decode() if isinstance(last, bytes) else last
        return [Delivery(decode_raw(eid, fields), 1, None) for eid, fields in entries]

    async def _claim(self, count: int) -> list[Delivery]:
        taken = await consumer_group.claim(
            self._store, self.name, count, self.visibility_timeout, self.max_deliveries
        )
        if taken:
            # Its lease ran out while this consumer still holds it (fetched, not handed
            # out yet; or its ack is on the way, held up by a failover): handing it out
            # again would only process it twice. It stays pending, claimed afresh.
            held = self._read_ahead_ids()
            taken = [(m, n) for m, n in taken if m.id not in held and m.id not in self._acks]
        settle, control = self._settle, self._settle_other
        return [Delivery(message, times, settle, control) for message, times in taken]

    def _read_ahead_ids(self) -> set[int]:
        """The ids fetched and not handed out (left where they are)."""
        ids = {d.id for d in self._batch[self._index :]}
        ids.update(d.id for d in self._unbuffered)
        items = [self._buffer.get_nowait() for _ in range(self._buffer.qsize())]
        for item in items:
            self._buffer.put_nowait(item)
            if not isinstance(item, _End):
                ids.update(d.id for d in item)
        return ids
