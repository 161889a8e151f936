"""Queues: ordered, sharded message queues with attach/detach leases and expiry."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from . import controls, inventory, pushing
from .consumer import Consumer
from .consuming import LATEST, Mode
from .controls import QueueInfo, RateLimit, RetryPolicy
from .durability import Durability
from .errors import DurabilityError, UnknownMessageError
from .events import Event, EventHub
from .keys import dead_letter_name
from .message import (
    EncodedMessage,
    Message,
    Payload,
)
from .pushing import Flat, Headers, Item, PushResult
from .queue_store import QueueStore

if TYPE_CHECKING:
    from .context import BusContext


@dataclass(frozen=True)
class Retention:
    """How much history a queue keeps: at most ``max_length`` messages and none older
    than ``max_age`` seconds. Trimming drops the oldest messages whether or not they
    were consumed; it is meant for replay queues (and as a safety cap)."""

    max_length: int | None = None
    max_age: float | None = None

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise ValueError("Retention.max_length must be at least 1")
        if self.max_age is not None and self.max_age <= 0:
            raise ValueError("Retention.max_age must be positive")


class Queue:
    """A named queue on the bus. Obtain with :meth:`Bus.queue`.

    A queue lives while at least one client is attached; after the last detach it
    expires, with its messages, after its idle ``ttl``. ``async with queue:`` attaches
    and detaches. Attaching creates the queue; every other operation works on a queue
    that exists, attached or not, and raises :class:`QueueNotFoundError` otherwise.
    """

    _attachments = itertools.count(1)

    def __init__(self, bus: BusContext, name: str) -> None:
        self.store = QueueStore(bus, name)
        """The queue's Redis side (for the gateway and tools; see :mod:`busmq.queue_store`)."""
        self.name = self.store.name
        self._bus = bus
        self._member: str | None = None
        self._detaching: asyncio.Future[None] | None = None
        self._auto_renew = True
        self._consumers: set[Consumer] = set()
        self.events: EventHub[Event] = EventHub()
        self.pushed = 0
        """Messages this client pushed to the queue."""
        self.consumed = 0
        """Messages this client's consumers handed out."""

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} attached={self.attached}>"

    @property
    def attached(self) -> bool:
        return self._member is not None

    @property
    def auto_renew(self) -> bool:
        """Whether the bus renews the attachment's lease (see :meth:`attach`)."""
        return self._auto_renew

    # -- attachment ---------------------------------------------------------------

    async def attach(
        self,
        *,
        ttl: float | None = None,
        retention: Retention | None = None,
        max_backlog: int | None = None,
        auto_renew: bool = True,
    ) -> bool:
        """Attach to the queue, creating it if needed; returns whether it was created.

        Args:
            ttl: seconds the queue survives after the last client detached
                (default ``BusSettings.default_ttl``; the last attach that sets it wins).
            retention: history bound, see :class:`Retention` (``None`` keeps the current).
            max_backlog: refuse pushes (``QueueFullError``) that would store more than
                this many messages (``None`` keeps the current, ``0`` removes the limit).
            auto_renew: renew the lease from the bus (default). With ``False`` the
                caller renews with :meth:`renew` (the gateway does this for its clients).
        """
        if self._member is not None:
            return False
        ttl_ms = _ms(ttl if ttl is not None else self._bus.settings.default_ttl)
        if ttl_ms < 1:
            raise ValueError("ttl must be positive")
        if max_backlog is not None and max_backlog < 0:
            raise ValueError("max_backlog must not be negative")
        store = self.store
        store.shard = shard = await store.locate()
        member = f"{self._bus.client_id}:{next(self._attachments)}"
        limits = _limit_args(retention, max_backlog)
        created, _ = await self._lease(member, create=True, ttl_ms=str(ttl_ms), limits=limits)
        self._bus.placement.remember(store.keys.info, shard)
        self._member = member
        self._auto_renew = auto_renew
        self._bus.attached.add(self)
        self.events.emit(Event("attached", self.name, details={"created": bool(created)}))
        return bool(created)

    async def detach(self) -> None:
        """Stop this client's consumers and release the attachment. Safe to call
        concurrently: a second call waits for the first one's release."""
        if self._detaching is not None:
            await asyncio.shield(self._detaching)
            return
        if self._member is None:
            return
        # Taken before the first await, so an overlapping detach sees it gone.
        member, self._member = self._member, None
        self._detaching = asyncio.get_running_loop().create_future()
        self._bus.attached.discard(self)
        try:
            for consumer in tuple(self._consumers):
                await consumer.close()
            keys = self.store.keys.all()
            await self.store.run(
                lambda c: self._bus.scripts.call(c, "detach", keys, [member]), idempotent=True
            )
        finally:
            self._detaching.set_result(None)
            self._detaching = None
            self.events.emit(Event("detached", self.name))

    async def renew(self) -> bool:
        """Renew the attachment lease (the bus does this on its own); returns False and
        detaches if the queue no longer exists."""
        if self._member is None:
            return False
        created, _ = await self._lease(self._member, create=False, ttl_ms="", limits=("", "", ""))
        if created == -1:
            await self._lost()
            return False
        return True

    async def _lease(
        self, member: str, *, create: bool, ttl_ms: str, limits: tuple[str, str, str]
    ) -> tuple[int, int]:
        lease_ms = _ms(self._bus.settings.lease_seconds)
        # On the fast connection: the bus renews every attached queue at once, and a
        # burst of redis-py calls would stall the loop for milliseconds.
        reply = await self.store.run_fast(
            lambda c: self._bus.scripts.call(
                c,
                "attach",
                self.store.keys.with_dead_letters(),
                [member, lease_ms, ttl_ms, "1" if create else "0", *limits],
            ),
            idempotent=True,
        )
        return int(reply[0]), int(reply[1])

    async def _lost(self) -> None:
        """The queue was closed elsewhere or expired: end consumers, drop the attachment."""
        self._member = None
        self._bus.attached.discard(self)
        for consumer in tuple(self._consumers):
            await consumer.close()
        self.events.emit(Event("closed", self.name))

    async def __aenter__(self) -> Queue:
        await self.attach()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.detach()

    # -- pushing --------------------------------------------------------------------

    async def push(
        self,
        value: Payload,
        *,
        headers: Headers | None = None,
        request_id: str | None = None,
        durability: Durability | str | None = None,
        delay: float | None = None,
        at: datetime | None = None,
        ttl: float | None = None,
        expires_at: datetime | None = None,
    ) -> int:
        """Push one message; returns its id.

        ``value`` is bytes, str, or a JSON-serialisable value. Give a ``request_id`` to
        make retries idempotent: a push with a ``request_id`` seen in the last
        ``BusSettings.dedupe_seconds`` stores nothing and returns the original id.
        ``durability`` overrides ``BusSettings.durability`` for this push (``"async"``,
        ``"replicas=N"``, ``"fsync"``; see :mod:`busmq.durability`).

        ``delay`` (seconds, by Redis's clock) or ``at`` (an aware datetime) hold the
        message back: its id is issued now, it is delivered once due (see
        :mod:`busmq.controls`). ``ttl`` (seconds) or ``expires_at``: a message not
        delivered by then is not delivered; it goes to the dead-letter queue with reason
        ``expired``, or is dropped if the queue says so (:meth:`drop_expired`).
        """
        ids = await self.push_batch(
            [value if headers is None else (value, headers)],
            request_id=request_id,
            durability=durability,
            delay=delay,
            at=at,
            ttl=ttl,
            expires_at=expires_at,
        )
        return ids[0]

    async def push_batch(
        self,
        items: Iterable[Item],
        *,
        request_id: str | None = None,
        durability: Durability | str | None = None,
        delay: float | None = None,
        at: datetime | None = None,
        ttl: float | None = None,
        expires_at: datetime | None = None,
    ) -> list[int]:
        """Push several messages atomically, in order, in one round trip; returns their ids.

        Each item is a value, a ``(value, headers)`` pair, or an already encoded
        :class:`~busmq.message.EncodedMessage`. Either all are stored or, on error, none.
        ``delay``/``at`` and ``ttl``/``expires_at`` apply to every message (see :meth:`push`).
        """
        flat, count = pushing.flatten(items, self._bus.settings.max_message_bytes)
        due_and_expiry = pushing.timing(delay, at, ttl, expires_at)
        result = await self._store(flat, count, request_id, durability, due_and_expiry)
        return result.ids

    async def push_encoded(
        self,
        encoded: Sequence[EncodedMessage],
        *,
        request_id: str | None = None,
        durability: Durability | str | None = None,
        delay: float | None = None,
        at: datetime | None = None,
        ttl: float | None = None,
        expires_at: datetime | None = None,
    ) -> PushResult:
        """Push already encoded messages (sizes are the caller's to check); see
        :meth:`push_batch`. Also tells whether ``request_id`` had been stored before."""
        flat = pushing.flatten_encoded(encoded)
        due_and_expiry = pushing.timing(delay, at, ttl, expires_at)
        return await self._store(flat, len(encoded), request_id, durability, due_and_expiry)

    async def _store(
        self,
        flat: Flat,
        count: int,
        request_id: str | None,
        durability: Durability | str | None,
        due_and_expiry: tuple[str, str],
    ) -> PushResult:
        try:
            result = await pushing.store(
                self.store, flat, count, request_id, durability, due_and_expiry
            )
        except DurabilityError as exc:  # applied by the master: counted as pushed
            self.pushed += len(exc.ids)
            raise
        if not result.duplicate:
            self.pushed += count
        return result

    # -- consuming ------------------------------------------------------------------

    def consume(
        self,
        mode: Mode = Mode.AT_MOST_ONCE,
        *,
        max: int | None = None,
        from_id: int = LATEST,
        prefetch: int = 100,
        visibility_timeout: float = 30.0,
        max_deliveries: int | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> Consumer:
        """A consumer of this queue: ``async with queue.consume(...) as c: async for d in c``.

        Args:
            mode: at-most-once (default), at-least-once, or replay. Destructive modes
                (the first two) and replay are exclusive per queue: the first consumer
                fixes it until the queue is closed or expires.
            max: stop after this many messages.
            from_id: replay only: the first id to read (0 for the oldest retained), or
                ``LATEST`` for only messages pushed from now on.
            prefetch: messages fetched per read, and the bound on read-ahead.
            visibility_timeout: at-least-once: seconds a delivery may stay unacked
                before another consumer takes it over.
            max_deliveries: at-least-once: a message delivered this many times without
                an ack goes to the dead-letter queue (default: the queue's
                :meth:`set_max_deliveries`, else never).
            retry_policy: at-least-once: a nack waits as the policy says before the
                message is delivered again (default: redelivered at once).
        """
        self.store.require_open()
        return Consumer(
            self,
            mode,
            max=max,
            from_id=from_id,
            prefetch=prefetch,
            visibility_timeout=visibility_timeout,
            max_deliveries=max_deliveries,
            retry_policy=retry_policy,
        )

    async def ack(self, *ids: int) -> int:
        """Acknowledge at-least-once deliveries by id, whichever consumer received them.

        Returns how many were acknowledged. Raises :class:`UnknownMessageError` naming
        ids that were not pending, after acknowledging the others.
        """
        unknown = await self.store.ack(list(ids))
        if unknown:
            raise UnknownMessageError(self.name, unknown)
        return len(ids)

    # -- inspection and management ------------------------------------------------

    async def count(self) -> int:
        """Messages stored: not yet consumed, plus delivered-but-unacked (at-least-once),
        or the retained history (replay)."""
        await self.store.send_deferred()
        stream = self.store.keys.stream
        return int(await self.store.run(lambda c: c.xlen(stream), idempotent=True))

    async def exists(self) -> bool:
        return await self.store.exists()

    async def ttl(self) -> float | None:
        """Seconds until the queue expires if no client renews an attachment, or
        ``None`` if it does not exist."""
        info = self.store.keys.info
        pttl = int(await self.store.run(lambda c: c.pttl(info), idempotent=True))
        return None if pttl < 0 else pttl / 1000

    async def last_id(self) -> int:
        """The id of the last message pushed (0 if none)."""
        info = self.store.keys.info
        seq = await self.store.run(lambda c: c.hget(info, "seq"), idempotent=True)
        return int(seq or 0)

    async def flush(self) -> None:
        """Remove every stored message; ids keep increasing from where they were."""
        self.store.require_open()
        await self.store.require_exists()
        keys = self.store.keys
        held = (keys.due, keys.delayed, keys.alias, keys.state, keys.parked)

        async def run(client: aioredis.Redis) -> None:
            pipe = client.pipeline(transaction=True)
            pipe.xtrim(keys.stream, maxlen=0)
            pipe.delete(*held)
            await pipe.execute()

        await self.store.run(run, idempotent=True)

    async def close(self) -> None:
        """Destroy the queue for every client: its messages, metadata and attachments.
        Other clients' consumers end; their next renewal reports ``closed``."""
        for consumer in tuple(self._consumers):
            await consumer.close()
        keys = self.store.keys.all()
        await self.store.run(lambda c: c.delete(*keys), idempotent=True)
        self._bus.placement.forget(self.store.keys.info)
        if self._member is not None:
            await self._lost()

    async def metadata(self) -> dict[str, str]:
        """The queue's user metadata."""
        meta = self.store.keys.meta
        raw: dict[bytes, bytes] = await self.store.run(
            lambda c: c.hgetall(meta),  # type: ignore[arg-type,return-value]
            idempotent=True,
        )
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def set_metadata(self, values: Mapping[str, str]) -> None:
        """Set user metadata fields (strings); they expire with the queue."""
        self.store.require_open()
        await self.store.require_exists()
        if not values:
            return
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in values.items()):
            raise ValueError("metadata must map non-empty str to str")
        keys = self.store.keys
        await self.store.run(
            lambda c: _hset_keep_ttl(c, keys.meta, keys.info, values), idempotent=True
        )

    # -- processing controls (see busmq.controls) --------------------------------------

    async def info(self) -> QueueInfo:
        """Counts (stored, pending, delayed, dead letters) and the controls in force."""
        return await controls.read_info(self.store)

    def browse(
        self, from_id: int = 0, to_id: int | None = None, *, follow: bool = False
    ) -> AsyncIterator[Message]:
        """The stored messages from ``from_id`` up to ``to_id`` (inclusive) in stream
        order, without consuming, acking or fixing the queue's mode: for inspection,
        tails, exports and copies. With ``follow``, then each new message as it is
        stored, until the iteration is closed (no ``to_id`` then). Delayed messages
        appear once due (at their stream position, after what was stored before)."""
        return inventory.browse(self.store, from_id, to_id, follow=follow)

    async def pause(self) -> None:
        """Stop deliveries to every consumer (in every process) until :meth:`resume`;
        pushes go on. At-least-once consumers give back what they fetched and have not
        handed out (the next read after :meth:`resume` redelivers it first); at-most-once
        consumers hand out what they hold, which their reads removed from Redis."""
        await controls.set_controls(self.store, paused="1")
        self.store.paused()

    async def resume(self) -> None:
        """Restart deliveries after :meth:`pause`."""
        await controls.set_controls(self.store, paused=None)

    async def set_rate_limit(self, limit: RateLimit | None) -> None:
        """Limit deliveries across every consumer: ``RateLimit(200, 1.0)`` is 200 per
        second for the queue; ``RateLimit(10, 1.0, key="tenant")`` is 10 per second for
        each value of header ``tenant`` (a queue has at most one of each kind; messages
        without the header are not limited by it). ``None`` removes both kinds."""
        if limit is None:
            await controls.set_controls(self.store, rate=None, tk=None, tt=None, krate=None)
        elif limit.key is None:
            await controls.set_controls(self.store, rate=limit.encode(), tk=None, tt=None)
        else:
            await controls.set_controls(self.store, krate=limit.encode())

    async def set_max_deliveries(self, max_deliveries: int | None) -> None:
        """A message delivered this many times without an ack goes to the dead-letter
        queue (reason ``max-deliveries``); ``None``: redeliver for ever. A consumer's
        own ``max_deliveries`` takes precedence."""
        if max_deliveries is not None and max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        value = None if max_deliveries is None else str(max_deliveries)
        await controls.set_controls(self.store, maxdel=value)

    async def drop_expired(self, drop: bool = True) -> None:
        """Drop expired messages instead of dead-lettering them (reason ``expired``)."""
        await controls.set_controls(self.store, expdrop="1" if drop else None)

    def dead_letters(self) -> Queue:
        """The dead-letter queue, ``<name>:dead``: a normal queue (attach it to consume
        it; it is created with the first dead letter and lives as long as this one)."""
        return Queue(self._bus, dead_letter_name(self.name))

    async def requeue_dead(self, ids: Sequence[int] | None = None, *, limit: int = 0) -> list[int]:
        """Move dead letters back into this queue, oldest first: those with ``ids``, or
        all of them (at most ``limit`` if given). They come back as new messages with
        new ids, at the end of the queue; header ``busmq-requeued-id`` holds the id they
        had. Returns their new ids."""
        if limit < 0:
            raise ValueError("limit must not be negative")
        self.store.require_open()
        return await controls.requeue_dead(self.store, None if ids is None else list(ids), limit)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _limit_args(retention: Retention | None, max_backlog: int | None) -> tuple[str, str, str]:
    if retention is None:
        maxlen = maxage = ""
    else:
        maxlen = str(retention.max_length or 0)
        maxage = str(_ms(retention.max_age) if retention.max_age else 0)
    backlog = "" if max_backlog is None else str(max_backlog)
    return maxlen, maxage, backlog


async def _hset_keep_ttl(
    client: aioredis.Redis, key: str, info: str, values: Mapping[str, str]
) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.hset(key, mapping=dict(values))  # type: ignore[arg-type]
    pipe.pttl(info)
    _, pttl = await pipe.execute()
    if pttl > 0:
        await client.pexpire(key, pttl)
