"""Queues: ordered, sharded message queues with attach/detach leases and expiry.

:class:`Queue` is the queue API (:class:`~busmq.queue_api.QueueAPI`) over
:class:`LocalQueueBackend`: Lua scripts on the queue's shard (:mod:`busmq.queue_store`).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Never

import redis.asyncio as aioredis

from . import controls, inventory, ordering, pushing, queue_schema
from .consumer import Consumer
from .consuming import Mode
from .controls import QueueInfo, RateLimit
from .keys import dead_letter_name
from .leases import NO_LIMITS, RENEW, hold, lease, release_held
from .local_reader import local_consumer
from .message import EncodedMessage, Message
from .pushing import Item, PushOptions, PushResult
from .queue_api import AttachOptions, Owner, QueueAPI, Retention
from .queue_store import QueueStore
from .schemas import Compatibility, Schema, SchemaVersion, Violation

if TYPE_CHECKING:
    from .context import BusContext

__all__ = ["LocalQueueBackend", "Queue", "Retention"]


class Queue(QueueAPI[Never, Consumer]):
    """A named queue on the bus. Obtain with :meth:`Bus.queue`.

    A queue lives while at least one client is attached; after the last detach it
    expires, with its messages, after its idle ``ttl``. ``async with queue:`` attaches
    and detaches. Attaching creates the queue; every other operation works on a queue
    that exists, attached or not, and raises :class:`QueueNotFoundError` otherwise.
    """

    def __init__(self, bus: BusContext, name: str) -> None:
        self.store = QueueStore(bus, name)
        """The queue's Redis side (for the gateway and tools; see :mod:`busmq.queue_store`)."""
        super().__init__(self.store.name)
        self._bus = bus
        self.tracing = bus.tracing
        self._backend = self._local = LocalQueueBackend(self)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} attached={self.attached}>"

    @property
    def auto_renew(self) -> bool:
        """Whether the bus renews the attachment's lease (see :meth:`attach`)."""
        return self._local.auto_renew

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

    def dead_letters(self) -> Queue:
        """The dead-letter queue, ``<name>:dead``: a normal queue (attach it to consume
        it; it is created with the first dead letter and lives as long as this one)."""
        return Queue(self._bus, dead_letter_name(self.name))

    async def set_schema(
        self, schema: Schema, *, compatibility: Compatibility | str | None = None
    ) -> SchemaVersion:
        """Enforce ``schema`` (a :class:`JsonSchema`, or a :class:`ProtobufSchema` for
        binary payloads) on every push from now on, as the queue's next version.

        The version must be compatible with the earlier ones under the queue's mode
        (BACKWARD unless set; ``compatibility`` sets it): otherwise
        :class:`SchemaCompatibilityError` names what breaks, and the queue keeps its
        current version. Setting the current schema again adds no version. A push whose
        messages do not fit raises :class:`SchemaError` and stores nothing of its batch.
        See :mod:`busmq.schemas`."""
        mode = None if compatibility is None else Compatibility(compatibility)
        return await queue_schema.set_schema(self.store, schema, mode)

    async def schema(self) -> SchemaVersion | None:
        """The schema version enforced now (``None``: pushes are not checked)."""
        return await queue_schema.current(self.store)

    async def schema_versions(self) -> list[SchemaVersion]:
        """Every schema version the queue has had, oldest first."""
        return (await queue_schema.versions(self.store))[2]

    async def check_schema(self, payloads: Sequence[bytes]) -> tuple[int, list[Violation]] | None:
        """Check ``payloads`` (as pushed: JSON bytes) against the queue's current schema
        without pushing them: the version and what does not fit (``None``: no schema)."""
        current = await queue_schema.current(self.store)
        if current is None:
            return None
        compiled = await queue_schema.compiled(self.store, current.token)
        return current.version, compiled.violations(payloads)

    async def remove_schema(self) -> None:
        """Stop checking pushes. The versions are kept: a later :meth:`set_schema` is
        checked against the last one."""
        await queue_schema.remove_schema(self.store)


class LocalQueueBackend:
    """A queue on the bus's Redis: leases and pushes by Lua script on its shard."""

    _attachments = itertools.count(1)

    def __init__(self, queue: Queue) -> None:
        self._queue = Owner(queue)
        self._store = queue.store
        self._bus = queue.store.bus
        self._member: str | None = None
        self.auto_renew = True

    @property
    def attached(self) -> bool:
        return self._member is not None

    def require_open(self) -> None:
        self._store.require_open()

    # -- attachment ---------------------------------------------------------------

    async def attach(self, options: AttachOptions) -> bool:
        member = f"{self._bus.client_id}:{next(self._attachments)}"
        created = await hold(
            self._store,
            member,
            ttl=options.ttl,
            retention=options.retention,
            max_backlog=options.max_backlog,
        )
        self._member = member
        self.auto_renew = options.auto_renew
        self._bus.attached.add(self._queue())
        return created

    async def renew(self) -> bool:
        assert self._member is not None
        created, _ = await lease(self._store, self._member, RENEW, "", NO_LIMITS)
        return created != -1

    async def release(self) -> None:
        member = self._member
        self.forget()  # before the first await: an overlapping detach sees it gone
        if member is None:
            return
        await release_held(self._store, member)

    def forget(self) -> None:
        self._member = None
        self._bus.attached.discard(self._queue())

    # -- pushing and consuming ----------------------------------------------------------

    async def push_items(self, items: Iterable[Item], options: PushOptions) -> PushResult:
        values = None
        if self._bus.schemas.current.get(self._store.name) is not None:  # kept to check
            items = list(items)
            values = pushing.decoded_values(items)
        flat, count = pushing.flatten(items, self._bus.settings.max_message_bytes)
        return await pushing.store(self._store, flat, count, options, values)

    async def push_encoded(
        self, encoded: Sequence[EncodedMessage], options: PushOptions
    ) -> PushResult:
        return await pushing.store(
            self._store, pushing.flatten_encoded(encoded), len(encoded), options
        )

    def consumer(self, mode: Mode, **options: Any) -> Consumer:
        return local_consumer(self._queue(), self._store, mode, **options)

    async def ack(self, ids: list[int]) -> list[int]:
        return await self._store.ack(ids)

    # -- inspection and management ------------------------------------------------

    async def count(self) -> int:
        await self._store.send_deferred()
        stream = self._store.keys.stream
        return int(await self._store.run(lambda c: c.xlen(stream), idempotent=True))

    async def exists(self) -> bool:
        return await self._store.exists()

    async def ttl(self) -> float | None:
        info = self._store.keys.info
        pttl = int(await self._store.run(lambda c: c.pttl(info), idempotent=True))
        return None if pttl < 0 else pttl / 1000

    async def last_id(self) -> int:
        info = self._store.keys.info
        seq = await self._store.run(lambda c: c.hget(info, "seq"), idempotent=True)
        return int(seq or 0)

    async def flush(self) -> None:
        await self._store.require_exists()
        keys = self._store.keys
        held = (keys.due, keys.delayed, keys.alias, keys.state, keys.parked)

        async def run(client: aioredis.Redis) -> None:
            pipe = client.pipeline(transaction=True)
            pipe.xtrim(keys.stream, maxlen=0)
            pipe.delete(*held)
            await pipe.execute()

        await self._store.run(run, idempotent=True)

    async def destroy(self) -> None:
        keys = self._store.keys.all()
        await self._store.run(lambda c: c.delete(*keys), idempotent=True)
        self._bus.placement.forget(self._store.keys.info)
        self._bus.schemas.forget(self._store.name)  # its versions went with it

    async def metadata(self) -> dict[str, str]:
        meta = self._store.keys.meta
        raw: dict[bytes, bytes] = await self._store.run(
            lambda c: c.hgetall(meta),  # type: ignore[arg-type,return-value]
            idempotent=True,
        )
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def set_metadata(self, values: Mapping[str, str]) -> None:
        await self._store.require_exists()
        if not values:
            return
        keys = self._store.keys
        await self._store.run(
            lambda c: _hset_keep_ttl(c, keys.meta, keys.info, values), idempotent=True
        )

    # -- processing controls (see busmq.controls) --------------------------------------

    async def set_paused(self, paused: bool) -> None:
        await controls.set_controls(self._store, paused="1" if paused else None)
        if paused:
            self._store.paused()  # consumers here stop now, not when the publication comes

    async def set_rate_limit(self, limit: RateLimit | None) -> None:
        if limit is None:
            await controls.set_controls(self._store, rate=None, tk=None, tt=None, krate=None)
        elif limit.key is None:
            await controls.set_controls(self._store, rate=limit.encode(), tk=None, tt=None)
        else:
            await controls.set_controls(self._store, krate=limit.encode())

    async def set_max_deliveries(self, max_deliveries: int | None) -> None:
        value = None if max_deliveries is None else str(max_deliveries)
        await controls.set_controls(self._store, maxdel=value)

    async def set_drop_expired(self, drop: bool) -> None:
        await controls.set_controls(self._store, expdrop="1" if drop else None)

    async def set_ordering(self, header: str | None) -> None:
        await ordering.set_ordering(self._store, header)

    async def requeue_dead(self, ids: list[int] | None, limit: int) -> list[int]:
        return await controls.requeue_dead(self._store, ids, limit)


async def _hset_keep_ttl(
    client: aioredis.Redis, key: str, info: str, values: Mapping[str, str]
) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.hset(key, mapping=dict(values))  # type: ignore[arg-type]
    pipe.pttl(info)
    _, pttl = await pipe.execute()
    if pttl > 0:
        await client.pexpire(key, pttl)
