"""The queue API, written once over a backend.

:class:`QueueAPI` holds what a queue does for its caller whatever holds it: argument
checks, the attachment's life (attach, renew, detach, lost), pushes and their counts,
consumers and their registry, acks, inspection, the processing controls, events. A
:class:`QueueBackend` holds what differs: Redis scripts on a shard for a local queue
(:class:`busmq.Queue`), calls through a gateway's link and the outbox for a remote one
(:class:`busmq.federation.FederatedQueue`).

What differs over the network is the backend's, and shows in the types: a remote push
may go to the outbox and return ``None`` (``Absent`` is ``None`` for a remote queue and
``Never`` for a local one), and each backend makes its own kind of consumer.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

from .consuming import LATEST, Mode
from .errors import DurabilityError, UnknownMessageError
from .events import Event, EventHub
from .message import EncodedMessage, with_headers
from .ordering import validate_header
from .pushing import Producer, PushOptions, PushResult, Sequenced

if TYPE_CHECKING:
    from .controls import RateLimit, RetryPolicy
    from .durability import Durability
    from .message import Payload
    from .pushing import Headers, Item
    from .tracing import Tracing


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


@dataclass(frozen=True)
class AttachOptions:
    """The arguments of :meth:`QueueAPI.attach`, checked, as a backend takes them."""

    ttl: float | None = None
    retention: Retention | None = None
    max_backlog: int | None = None
    auto_renew: bool = True


Q = TypeVar("Q")


class Owner(Generic[Q]):
    """A backend's link to its queue object: a weak reference, so that the two make no
    cycle (a cycle waits for the cyclic collector, and a gateway makes a queue object
    per request: its memory grew 37 MiB in 20 rounds of 500 streams with one)."""

    __slots__ = ("_ref",)

    def __init__(self, queue: Q) -> None:
        self._ref = weakref.ref(queue)

    def __call__(self) -> Q:
        queue = self._ref()
        if queue is None:  # pragma: no cover - a queue object holds its backend
            raise RuntimeError("the queue object is gone")
        return queue

    def get(self) -> Q | None:
        """The queue object, or None once its owner dropped it."""
        return self._ref()


class Closable(Protocol):
    async def close(self) -> None: ...


Absent = TypeVar("Absent", covariant=True)
"""What a push returns when it was kept for later: ``Never`` locally, ``None`` remotely."""
C = TypeVar("C", bound=Closable)
C_co = TypeVar("C_co", bound=Closable, covariant=True)


class QueueBackend(Protocol[Absent, C_co]):
    """What a queue object needs from whatever holds the queue."""

    @property
    def attached(self) -> bool: ...

    def require_open(self) -> None:
        """Raise :class:`~busmq.BusClosedError` if the bus (or federation) is closed."""

    async def attach(self, options: AttachOptions) -> bool:
        """Take an attachment (creating the queue if needed); whether it was created."""
        ...

    async def renew(self) -> bool:
        """Renew the attachment; False if the queue is gone."""
        ...

    async def release(self) -> None:
        """Give the attachment up (the queue object's consumers are closed)."""

    def forget(self) -> None:
        """The queue is gone: drop the attachment without a call."""

    async def push_items(self, items: Iterable[Item], options: PushOptions) -> PushResult | Absent:
        """Store values, ``(value, headers)`` pairs or encoded messages; ``Absent`` if
        kept to be stored later."""
        ...

    async def push_encoded(
        self, encoded: Sequence[EncodedMessage], options: PushOptions
    ) -> PushResult | Absent: ...

    def consumer(self, mode: Mode, **options: Any) -> C_co: ...

    async def ack(self, ids: list[int]) -> list[int]:
        """Acknowledge; the ids that were not pending."""
        ...

    async def count(self) -> int: ...

    async def exists(self) -> bool: ...

    async def ttl(self) -> float | None: ...

    async def last_id(self) -> int: ...

    async def flush(self) -> None: ...

    async def destroy(self) -> None: ...

    async def metadata(self) -> dict[str, str]: ...

    async def set_metadata(self, values: Mapping[str, str]) -> None: ...

    async def set_paused(self, paused: bool) -> None: ...

    async def set_rate_limit(self, limit: RateLimit | None) -> None: ...

    async def set_max_deliveries(self, max_deliveries: int | None) -> None: ...

    async def set_drop_expired(self, drop: bool) -> None: ...

    async def set_ordering(self, header: str | None) -> None: ...

    async def requeue_dead(self, ids: list[int] | None, limit: int) -> list[int]: ...


class QueueAPI(Generic[Absent, C]):
    """A queue: attach, push, consume, ack, inspect and control it (see the subclasses
    :class:`busmq.Queue` and :class:`busmq.federation.FederatedQueue`).

    A queue lives while at least one client is attached; after the last detach it
    expires, with its messages, after its idle ``ttl``. ``async with queue:`` attaches
    and detaches. Attaching creates the queue; every other operation works on a queue
    that exists, attached or not, and raises :class:`QueueNotFoundError` otherwise.

    Attributes:
        name: the queue name.
        events: the queue's events (``attached``, ``detached``, ``consuming``,
            ``stopped``, ``closed``, ``dropped``, ``error``).
        pushed: messages this client pushed to the queue.
        consumed: messages this client's consumers handed out.
    """

    _backend: QueueBackend[Absent, C]
    tracing: Tracing | None = None
    """Trace propagation (:mod:`busmq.tracing`), from the bus's settings."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.events: EventHub[Event] = EventHub()
        self.pushed = 0
        self.consumed = 0
        self._consumers: set[C] = set()
        self._detaching: asyncio.Future[None] | None = None

    @property
    def attached(self) -> bool:
        return self._backend.attached

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
            auto_renew: renew the lease on its own (default). With ``False`` the
                caller renews with :meth:`renew` (the gateway does this for its clients).
        """
        if self._backend.attached:
            return False
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be positive")
        if max_backlog is not None and max_backlog < 0:
            raise ValueError("max_backlog must not be negative")
        options = AttachOptions(ttl, retention, max_backlog, auto_renew)
        created = await self._backend.attach(options)
        self.events.emit(Event("attached", self.name, details={"created": created}))
        return created

    async def detach(self) -> None:
        """Stop this client's consumers and release the attachment. Safe to call
        concurrently: a second call waits for the first one's release."""
        if self._detaching is not None:
            await asyncio.shield(self._detaching)
            return
        if not self._backend.attached:
            return
        self._detaching = asyncio.get_running_loop().create_future()
        try:
            for consumer in tuple(self._consumers):
                await consumer.close()
            await self._backend.release()
        finally:
            self._detaching.set_result(None)
            self._detaching = None
            self.events.emit(Event("detached", self.name))

    async def renew(self) -> bool:
        """Renew the attachment lease (done on its own unless attached with
        ``auto_renew=False``); returns False and detaches if the queue no longer exists."""
        if not self._backend.attached:
            return False
        if await self._backend.renew():
            return True
        await self._lost()
        return False

    async def _lost(self) -> None:
        """The queue was closed elsewhere or expired: end consumers, drop the attachment."""
        self._backend.forget()
        for consumer in tuple(self._consumers):
            await consumer.close()
        self.events.emit(Event("closed", self.name))

    async def __aenter__(self) -> Self:
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
        producer: str | Producer | None = None,
        sequence: int | None = None,
    ) -> int | Absent:
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

        ``producer`` and ``sequence`` make a push idempotent with no time window: the
        queue keeps each producer's last sequence for as long as it lives, and a push at
        or below it stores nothing (it returns the original id when it repeats the last
        push, else 0: only the last push's ids are kept). Sequences must increase; gaps
        are allowed. A :class:`Producer` from :meth:`Bus.producer` also fences: once a
        newer instance of the producer has pushed to the queue, an older one's pushes
        raise :class:`ProducerFencedError`. See "Exactly once" in the README.
        """
        item = value if headers is None else (value, headers)
        options = PushOptions(
            request_id, durability, delay, at, ttl, expires_at, Sequenced.of(producer, sequence)
        )
        if self.tracing is not None:
            result = await self._traced(self.tracing, (item,), options, 1)
        else:
            result = await self._pushed(1, self._backend.push_items((item,), options))
        if isinstance(result, PushResult):
            return result.ids[0] if result.ids else 0
        return result

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
        producer: str | Producer | None = None,
        sequence: int | None = None,
    ) -> list[int] | Absent:
        """Push several messages atomically, in order, in one round trip; returns their ids.

        Each item is a value, a ``(value, headers)`` pair, or an already encoded
        :class:`~busmq.message.EncodedMessage`. Either all are stored or, on error, none.
        ``delay``/``at``, ``ttl``/``expires_at`` and ``producer``/``sequence`` (one
        sequence for the whole batch) apply as for :meth:`push`; a duplicate of an older
        sequence returns an empty list.
        """
        options = PushOptions(
            request_id, durability, delay, at, ttl, expires_at, Sequenced.of(producer, sequence)
        )
        if self.tracing is not None:
            result = await self._traced(self.tracing, items, options, None)
        else:
            result = await self._pushed(None, self._backend.push_items(items, options))
        return result.ids if isinstance(result, PushResult) else result

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
        producer: str | Producer | None = None,
        sequence: int | None = None,
    ) -> PushResult | Absent:
        """Push already encoded messages (sizes are the caller's to check); see
        :meth:`push_batch`. Also tells whether ``request_id`` had been stored before."""
        options = PushOptions(
            request_id, durability, delay, at, ttl, expires_at, Sequenced.of(producer, sequence)
        )
        if self.tracing is not None:
            return await self._traced(self.tracing, encoded, options, len(encoded))
        return await self._pushed(len(encoded), self._backend.push_encoded(encoded, options))

    async def _traced(
        self, tracing: Tracing, items: Iterable[Item], options: PushOptions, count: int | None
    ) -> PushResult | Absent:
        """A push in a PRODUCER span, its context in every message's headers."""
        batch = list(items)
        with tracing.send(self.name, len(batch)) as (carrier, span):
            # push_items checks every message's size, trace headers included.
            push = self._backend.push_items(with_headers(batch, carrier), options)
            result = await self._pushed(count, push)
            tracing.sent(span, result.ids if isinstance(result, PushResult) else None)
            return result

    async def _pushed(
        self, count: int | None, push: Awaitable[PushResult | Absent]
    ) -> PushResult | Absent:
        """The result of ``push``, counted in :attr:`pushed` (``count``: how many messages,
        ``None``: as many as it stored)."""
        try:
            result = await push
        except DurabilityError as exc:  # applied by the master: counted as pushed
            self.pushed += len(exc.ids)
            raise
        if isinstance(result, PushResult) and not result.duplicate:
            self.pushed += len(result.ids) if count is None else count
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
    ) -> C:
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
        self._backend.require_open()
        return self._backend.consumer(
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
        unknown = await self._backend.ack(list(ids))
        if unknown:
            raise UnknownMessageError(self.name, unknown)
        return len(ids)

    # -- inspection and management ------------------------------------------------

    async def count(self) -> int:
        """Messages stored: not yet consumed, plus delivered-but-unacked (at-least-once),
        or the retained history (replay)."""
        return await self._backend.count()

    async def exists(self) -> bool:
        return await self._backend.exists()

    async def ttl(self) -> float | None:
        """Seconds until the queue expires if no client renews an attachment, or
        ``None`` if it does not exist."""
        return await self._backend.ttl()

    async def last_id(self) -> int:
        """The id of the last message pushed (0 if none)."""
        return await self._backend.last_id()

    async def flush(self) -> None:
        """Remove every stored message; ids keep increasing from where they were."""
        self._backend.require_open()
        await self._backend.flush()

    async def close(self) -> None:
        """Destroy the queue for every client: its messages, metadata and attachments.
        Other clients' consumers end; their next renewal reports ``closed``."""
        for consumer in tuple(self._consumers):
            await consumer.close()
        await self._backend.destroy()
        if self._backend.attached:
            await self._lost()

    async def metadata(self) -> dict[str, str]:
        """The queue's user metadata."""
        return await self._backend.metadata()

    async def set_metadata(self, values: Mapping[str, str]) -> None:
        """Set user metadata fields (strings); they expire with the queue."""
        self._backend.require_open()
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in values.items()):
            raise ValueError("metadata must map non-empty str to str")
        await self._backend.set_metadata(values)

    # -- processing controls (see busmq.controls) --------------------------------------

    async def pause(self) -> None:
        """Stop deliveries to every consumer (in every process) until :meth:`resume`;
        pushes go on. At-least-once consumers give back what they fetched and have not
        handed out (the next read after :meth:`resume` redelivers it first); at-most-once
        consumers hand out what they hold, which their reads removed from Redis."""
        await self._backend.set_paused(True)

    async def resume(self) -> None:
        """Restart deliveries after :meth:`pause`."""
        await self._backend.set_paused(False)

    async def set_rate_limit(self, limit: RateLimit | None) -> None:
        """Limit deliveries across every consumer: ``RateLimit(200, 1.0)`` is 200 per
        second for the queue; ``RateLimit(10, 1.0, key="tenant")`` is 10 per second for
        each value of header ``tenant`` (a queue has at most one of each kind; messages
        without the header are not limited by it). ``None`` removes both kinds."""
        await self._backend.set_rate_limit(limit)

    async def set_max_deliveries(self, max_deliveries: int | None) -> None:
        """A message delivered this many times without an ack goes to the dead-letter
        queue (reason ``max-deliveries``); ``None``: redeliver for ever. A consumer's
        own ``max_deliveries`` takes precedence."""
        if max_deliveries is not None and max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        await self._backend.set_max_deliveries(max_deliveries)

    async def set_ordering(self, key: str | None) -> None:
        """Order deliveries per key: messages with the same value of header ``key`` go
        out one at a time, in push order, across every consumer in every process; other
        keys go out in parallel. A key's next message is handed out only after the
        previous one is settled (acked, rejected, dead-lettered or expired); a ``nack()``
        or a lapsed visibility timeout hands the same message out again before any later
        one of its key; a delayed message holds its key's place. Messages without the
        header are unordered. ``None`` stops ordering (what waits goes out at once).

        Needs at-least-once consumers: raises :class:`OrderingError` on a replay queue,
        and an ordered queue refuses at-most-once and replay consumers. See
        :mod:`busmq.ordering`."""
        self._backend.require_open()
        await self._backend.set_ordering(None if key is None else validate_header(key))

    async def drop_expired(self, drop: bool = True) -> None:
        """Drop expired messages instead of dead-lettering them (reason ``expired``)."""
        await self._backend.set_drop_expired(drop)

    async def requeue_dead(self, ids: Sequence[int] | None = None, *, limit: int = 0) -> list[int]:
        """Move dead letters back into this queue, oldest first: those with ``ids``, or
        all of them (at most ``limit`` if given). They come back as new messages with
        new ids, at the end of the queue; header ``busmq-requeued-id`` holds the id they
        had. Returns their new ids."""
        if limit < 0:
            raise ValueError("limit must not be negative")
        self._backend.require_open()
        return await self._backend.requeue_dead(None if ids is None else list(ids), limit)
