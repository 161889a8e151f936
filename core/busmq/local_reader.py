"""A local queue's deliveries for a consumer: its reads of Redis.

The reader fetches batches of up to ``prefetch`` messages. Reads never block in Redis:
when a queue is empty the reader waits for a wake-up from the shard's
:class:`~busmq.notifier.Notifier`.

- at-most-once: ``XREADGROUP ... NOACK``, and what it read is deleted. Each message goes
  to one consumer and is gone.
- at-least-once: ``XREADGROUP``; a delivery stays pending until acked. Every
  ``claim_interval`` the reader takes over deliveries that have been pending longer
  than ``visibility_timeout`` (their consumer died or stalled), with a delivery count,
  or dead-letters them past ``max_deliveries``.
- replay: ``XREAD`` from an id; nothing is removed, every reader sees every message.

The read script of the destructive modes also applies the processing controls (pause,
rate limits, due retries and delayed messages, expiry; see :mod:`busmq.controls`) and
says how long until something is due, which bounds the reader's idle wait. It also says
when none of that applies to the queue; the reader then reads with a plain
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
import time
from collections.abc import Sequence
from typing import Any

from . import consumer_group
from .consumer import Consumer, ConsumerHost
from .consuming import LATEST, Mode, wait_for_wakeup
from .controls import Settlement, ack_upto, settle
from .errors import BusError, BusUnavailableError, ModeConflictError
from .events import Event
from .forwarding import Forwarder
from .message import Delivery, ForwardTarget, decode_raw, int_to_stream_id
from .notifier import WakeUp
from .pushing import Item
from .queue_store import QueueStore
from .reads import GroupMissing, read_full, read_lean, read_replay

log = logging.getLogger(__name__)

_LEAN_SECONDS = 5.0  # longest run of lean reads between two full ones
_names = itertools.count(1)


def local_consumer(queue: ConsumerHost, store: QueueStore, mode: Mode, **options: Any) -> Consumer:
    """A consumer of ``queue`` (a :class:`~busmq.queue.Queue`), reading ``store``."""
    name = f"{store.bus.client_id}:{next(_names)}"
    return Consumer(queue, mode, LocalReader(store), name=name, **options)


class LocalReader:
    """Reads a local queue's messages for one consumer (see the module docstring)."""

    reconnects = 0
    stops_at_once = False

    def __init__(self, store: QueueStore) -> None:
        self.store = store
        self._fetched = 0
        self._next_claim = 0.0  # loop time of the next claim (at-least-once)
        self._not_reading = asyncio.Event()  # clear while a read is in flight
        self._not_reading.set()
        self._cursor = "0-0"  # replay: the last stream id read
        self._due_in: float | None = None  # seconds until something is due (read script)
        self._lean = False  # the last full read said no control applies (see the module)
        self._lean_until = 0.0  # loop time after which the next read is a full one
        self._forwarder: Forwarder | None = None  # made by the first forward

    async def open(self, consumer: Consumer) -> dict[str, Any]:
        """Fix the queue's mode (a conflict raises) and where replay starts."""
        current, last_id = await self.store.prepare_consumer(
            consumer.mode.family, consumer.mode is Mode.AT_LEAST_ONCE
        )
        if current != consumer.mode.family:
            raise ModeConflictError(consumer.queue.name, current, consumer.mode.family)
        if consumer.mode is Mode.REPLAY:
            from_id = consumer.from_id
            start = last_id + 1 if from_id == LATEST else max(from_id, 1)
            self._cursor = int_to_stream_id(start - 1)
        self.store.wakes.add(consumer.wake)
        return {}

    async def read(self, consumer: Consumer) -> None:
        store = self.store
        shard = store.shard
        assert shard is not None, "open() locates the queue"
        name = consumer.queue.name
        wake = await shard.notifier.watch(name)
        wake.serving = shard.serving
        store.wakes.discard(consumer.wake)
        store.wakes.add(wake)
        consumer.wake = wake
        backoff = 0.05
        try:
            while not consumer.stopping:
                count = consumer.prefetch
                if consumer.max is not None:
                    count = min(count, consumer.max - self._fetched)
                    if count <= 0:
                        break
                wake.clear()  # before reading, so a push during the read is not missed
                give_backs = wake.give_backs
                try:
                    batch = await self._claim_or_read(consumer, count)
                except BusUnavailableError as exc:
                    consumer.queue.events.emit(Event("error", name, error=exc))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, store.bus.settings.reconnect_backoff_max)
                    continue
                except GroupMissing:
                    wake.covered = 0
                    await store.prepare_consumer(
                        consumer.mode.family, consumer.mode is Mode.AT_LEAST_ONCE
                    )
                    continue
                backoff = 0.05
                if batch and wake.give_backs != give_backs and consumer.mode is Mode.AT_LEAST_ONCE:
                    await consumer.give_back(
                        [d.id for d in batch], "read as the queue paused or its master moved"
                    )
                    continue
                if batch:
                    self._fetched += len(batch)
                    store.bus.counters.delivered(name, batch)
                    await consumer.hand_over(batch)
                if len(batch) < count:
                    # Drained: wait for a wake-up rather than make the empty read that
                    # would follow (a push during the read set ``wake`` already), or
                    # until something the read script reported is due.
                    if wake.stale():
                        wake.clear()  # only publications of what this read received
                    idle = self._idle_seconds(consumer)
                    if self._due_in is not None:
                        idle = min(idle, self._due_in)
                    wake.nudgeable = consumer.mode is not Mode.REPLAY
                    try:
                        await wait_for_wakeup(wake, idle, shard.notifier.tick)
                    finally:
                        wake.nudgeable = False
        finally:
            await shard.notifier.unwatch(name, wake)

    async def quiesce(self, consumer: Consumer) -> None:
        # What a read or claim in flight returns is already this consumer's in Redis
        # (at-most-once: removed): let it finish and give it back or count it with the
        # rest; but not wait out an outage (at-least-once: it comes back after the
        # visibility timeout).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.store.bus.settings.operation_timeout):
                await self._not_reading.wait()

    async def finish(self, consumer: Consumer, leftovers: list[int]) -> None:
        if consumer.mode is Mode.AT_MOST_ONCE:
            try:
                await self.store.send_deferred()  # what it read leaves the stream now
            except BusError as exc:
                log.debug("could not send the deletes of %s: %s", consumer.name, exc)
        elif consumer.mode is Mode.AT_LEAST_ONCE and leftovers:
            try:
                await consumer.nack(leftovers)
            except BusError as exc:
                log.warning("could not release %d deliveries: %s", len(leftovers), exc)
        if consumer.mode is not Mode.REPLAY and consumer.started:
            try:  # replay reads without the group; never started: never joined
                await consumer_group.leave(self.store, consumer.name)
            except BusError as exc:  # an idle consumer is forgotten later (claim.lua)
                log.debug("%s could not leave the group: %s", consumer.name, exc)
        self.store.wakes.discard(consumer.wake)

    # -- reads ----------------------------------------------------------------------

    async def _claim_or_read(self, consumer: Consumer, count: int) -> list[Delivery]:
        # close() waits for a read in flight rather than cancel it (see quiesce).
        self._not_reading.clear()
        try:
            return await self._claim_or_fetch(consumer, count)
        finally:
            self._not_reading.set()

    async def _claim_or_fetch(self, consumer: Consumer, count: int) -> list[Delivery]:
        """At-least-once: overdue deliveries first, every claim interval and again at once
        after a full claim (more may be overdue); otherwise new messages."""
        if consumer.mode is Mode.AT_LEAST_ONCE:
            now = asyncio.get_running_loop().time()
            if now >= self._next_claim:
                claimed = await self._claim(consumer, count)
                full = len(claimed) == count
                self._next_claim = now if full else now + self._claim_interval(consumer)
                if claimed:
                    return claimed
        return await self._fetch(consumer, count)

    def _claim_interval(self, consumer: Consumer) -> float:
        return min(consumer.visibility_timeout / 2, self.store.bus.settings.block_seconds)

    def _idle_seconds(self, consumer: Consumer) -> float:
        """Longest wait for a wake-up when the queue looked empty."""
        idle = self.store.bus.settings.block_seconds
        if consumer.mode is Mode.AT_LEAST_ONCE:
            idle = min(idle, self._claim_interval(consumer))
        return idle

    async def _fetch(self, consumer: Consumer, count: int) -> list[Delivery]:
        mode = consumer.mode
        if mode is Mode.REPLAY:
            return await self._fetch_replay(count)
        loop = asyncio.get_running_loop()
        noack = mode is Mode.AT_MOST_ONCE
        wake = consumer.wake
        if self._reads_lean(wake):
            entries = await read_lean(self.store, consumer.name, count, noack)
            self._due_in = None
            if noack:
                deliveries = [Delivery(decode_raw(eid, fields), 1, None) for eid, fields in entries]
            else:
                settle_one, control = consumer.settle_one, consumer.settle_other
                forward = consumer.forward
                deliveries = [
                    Delivery(decode_raw(eid, fields), 1, settle_one, control, forward)
                    for eid, fields in entries
                ]
            wake.cover(deliveries[-1].id if deliveries else 0)
            return deliveries
        wake.covered = 0
        # Cleared before the read: a change announced while it runs marks it again.
        wake.recheck = False
        self._lean = False
        entries, retried, wait, self._lean, last = await read_full(
            self.store, consumer.name, count, noack
        )
        if not wake.recheck:  # else a publication may be of ids the queue gives anew
            wake.cover(last)
        if self._lean:
            self._lean_until = loop.time() + _LEAN_SECONDS * (0.5 + random.random() / 2)
        self._due_in = None if wait < 0 else wait / 1000
        settle_full = None if noack else consumer.settle_one
        control_full = None if noack else consumer.settle_other
        forward_full = None if noack else consumer.forward
        deliveries = [
            Delivery(decode_raw(eid, fields), int(times), settle_full, control_full, forward_full)
            for eid, fields, times in retried
        ]
        deliveries.extend(
            Delivery(decode_raw(eid, fields), 1, settle_full, control_full, forward_full)
            for eid, fields in entries
        )
        return deliveries

    def _reads_lean(self, wake: WakeUp) -> bool:
        """Whether the next read is a plain ``XREADGROUP`` (see the module)."""
        return (
            self._lean and not wake.recheck and asyncio.get_running_loop().time() < self._lean_until
        )

    async def _fetch_replay(self, count: int) -> list[Delivery]:
        entries, wait = await read_replay(self.store, self._cursor, count)
        self._due_in = None if wait < 0 else wait / 1000
        if not entries:
            return []
        last = entries[-1][0]
        self._cursor = last.decode() if isinstance(last, bytes) else last
        return [Delivery(decode_raw(eid, fields), 1, None) for eid, fields in entries]

    async def _claim(self, consumer: Consumer, count: int) -> list[Delivery]:
        claimed_at = time.monotonic()
        taken = await consumer_group.claim(
            self.store, consumer.name, count, consumer.visibility_timeout, consumer.max_deliveries
        )
        if taken:
            # Its lease ran out while this consumer still holds it (fetched, not handed
            # out yet; or its ack is on the way, held up by a failover): handing it out
            # again would only process it twice. It stays pending, claimed afresh: the
            # read-ahead's copy is handed out, on a lease that runs from this claim.
            held = consumer.read_ahead_ids()
            if renewed := {m.id for m, _ in taken if m.id in held}:
                consumer.renewed(renewed, claimed_at)
            taken = [(m, n) for m, n in taken if m.id not in held and not consumer.acking(m.id)]
        settle_one, control = consumer.settle_one, consumer.settle_other
        forward = consumer.forward
        return [Delivery(message, times, settle_one, control, forward) for message, times in taken]

    # -- settling -------------------------------------------------------------------

    async def flush_acks(self, consumer: Consumer, ids: list[int]) -> list[int]:
        return await self.store.ack(ids)

    async def ack_upto(self, consumer: Consumer, message_id: int) -> int:
        return await ack_upto(self.store, consumer.name, message_id)

    async def nack(self, consumer: Consumer, ids: Sequence[int]) -> None:
        await self.settle(consumer, ids, Settlement(release=True))

    async def settle(
        self, consumer: Consumer, ids: Sequence[int], settlement: Settlement
    ) -> list[int]:
        return await settle(
            self.store,
            consumer.name,
            ids,
            settlement,
            retry_policy=consumer.retry_policy,
            max_deliveries=consumer.max_deliveries,
        )

    async def forward(
        self,
        consumer: Consumer,
        message_id: int,
        target: ForwardTarget,
        items: Sequence[Item],
        settle: bool,
    ) -> bool:
        if self._forwarder is None:
            self._forwarder = Forwarder(self.store)
        ack = (lambda: consumer.settle_one(message_id, True)) if settle else None
        return await self._forwarder.forward(message_id, target, items, ack)

    async def release_pending(self, consumer: Consumer, *, unless_ordered: bool) -> int:
        return await consumer_group.release_pending(
            self.store, consumer.name, unless_ordered=unless_ordered
        )
