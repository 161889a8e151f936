"""The bus: shards, placement, lease renewal, and the factory of queues."""

from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from .channel import Channel
from .cluster import ClusterShard
from .context import Lease
from .embedded import EmbeddedRedis
from .errors import BusClosedError, BusError, BusUnavailableError
from .events import Event, EventHub
from .keys import producer_epoch_key
from .persistable import Persistable
from .placement import Placement
from .pushing import Producer
from .queue import Queue
from .renewal import renew_in_slices
from .schemas import ValidatorCache
from .scripts import Scripts
from .service import Service
from .settings import BusSettings
from .shard import Shard, ShardState
from .stats import ProcessCounters
from .topology import is_cluster_url
from .tracing import Tracing

if TYPE_CHECKING:
    from .federation import FederatedQueue, FederationManager, FederationSettings
    from .federation.channel import FederatedChannel
    from .federation.persistable import FederatedPersistable
    from .federation.service import FederatedService

log = logging.getLogger(__name__)


class BusState(enum.Enum):
    """``online`` when every shard answers, ``offline`` otherwise."""

    CREATED = "created"
    ONLINE = "online"
    OFFLINE = "offline"
    CLOSED = "closed"


class Bus:
    """A message bus over one or more Redis deployments (shards).

    Use as ``async with Bus(settings) as bus:`` or ``await bus.connect()`` /
    ``await bus.close()``. With no Redis URL configured it runs an embedded
    ``redis-server`` (see :mod:`busmq.embedded`).

    Events (``bus.events``): ``online``, ``offline`` and ``error`` per shard, with the
    shard's URL (password masked) as source.

    ``tracer_provider``: where the spans of ``BusSettings.tracing`` go (default:
    OpenTelemetry's global provider).
    """

    def __init__(
        self,
        settings: BusSettings | None = None,
        *,
        tracer_provider: Any = None,
        **overrides: Any,
    ) -> None:
        if settings is None:
            settings = BusSettings(**overrides) if overrides else BusSettings.from_env()
        elif overrides:
            raise TypeError("pass either settings or keyword overrides, not both")
        self.settings = settings
        self.client_id = uuid.uuid4().hex[:16]
        self.events: EventHub[Event] = EventHub()
        self.shards: list[Shard] = []
        self.embedded: EmbeddedRedis | None = None
        self.scripts: Scripts
        self.placement = Placement()
        self.attached: set[Lease] = set()
        self.counters = ProcessCounters()
        self.schemas = ValidatorCache()
        self.tracing = Tracing(tracer_provider) if settings.tracing else None
        self._renewer: asyncio.Task[None] | None = None
        self._state = BusState.CREATED
        self.events.on(self._track_state)
        self._federation: FederationManager | None = None

    def __repr__(self) -> str:
        return f"<Bus {self.client_id} {self.state.value} shards={[s.label for s in self.shards]}>"

    @property
    def state(self) -> BusState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._state is BusState.CLOSED

    # -- lifecycle ------------------------------------------------------------------

    async def connect(self, wait: float | None = None) -> None:
        """Start the embedded Redis if needed and connect to every shard.

        Waits up to ``wait`` seconds (default: the operation timeout) for all shards to
        answer; raises :class:`BusUnavailableError` otherwise (the bus keeps retrying
        in the background: call ``close()`` to give up).
        """
        if self._state is not BusState.CREATED:
            raise BusError(f"connect() on a bus that is {self._state.value}")
        urls = self.settings.redis_urls
        if not urls:
            fsync_always = self.settings.durability.fsync
            self.embedded = EmbeddedRedis(self.settings.data_dir, fsync_always=fsync_always)
            await self.embedded.start()
            urls = (self.embedded.url,)
        self.shards = [
            (ClusterShard if is_cluster_url(url) else Shard)(url, self.settings, self.events)
            for url in urls
        ]
        self.placement = Placement(self.shards)
        try:
            await asyncio.gather(*(s.check_topology() for s in self.shards))
        except BaseException:
            await self._close_shards()
            raise
        sharded = self.shards[0].sharded_pubsub
        self.scripts = Scripts(self.shards[0].client, sharded_publish=sharded)
        self._state = BusState.OFFLINE
        for shard in self.shards:
            shard.start()
        self._renewer = asyncio.create_task(self._renew_loop(), name="busmq-lease-renewal")
        timeout = self.settings.operation_timeout if wait is None else wait
        results = await asyncio.gather(*(s.wait_online(timeout) for s in self.shards))
        down = [s for s, ok in zip(self.shards, results, strict=True) if not ok]
        if down:
            reasons = "; ".join(f"{s.label}: {s.last_error}" for s in down if s.last_error)
            raise BusUnavailableError(
                f"redis not reachable after {timeout:.1f}s" + (f" ({reasons})" if reasons else ""),
                ", ".join(s.label for s in down),
            )

    async def close(self) -> None:
        """Detach every queue, stop the shards and the embedded Redis."""
        if self._state is BusState.CLOSED:
            return
        if self._federation is not None:
            await self._federation.close()
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        for shard in self.shards:
            shard.closing = True
        try:
            for queue in tuple(self.attached):
                try:
                    await queue.detach()
                except BusError as exc:
                    log.warning("could not detach %s while closing: %s", queue.name, exc)
        finally:
            self._state = BusState.CLOSED
            await self._close_shards()
            self.events.emit(Event("closed", "bus"))
            self.events.close()

    async def _close_shards(self) -> None:
        await asyncio.gather(*(s.close() for s in self.shards), return_exceptions=True)
        if self.embedded is not None:
            await self.embedded.stop()

    async def __aenter__(self) -> Bus:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- objects --------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        """A handle on queue ``name`` (validated now; attach it to create it)."""
        self._require_open()
        return Queue(self, name)

    def channel(
        self, name: str, local: str = "local", remote: str = "remote", *, ttl: float | None = None
    ) -> Channel:
        """One end of channel ``name``, playing ``local`` towards ``remote``."""
        self._require_open()
        return Channel(self, name, local=local, remote=remote, ttl=ttl)

    def persistable(
        self, name: str, fields: Iterable[str] | Mapping[str, Any], *, ttl: float | None = None
    ) -> Persistable:
        """Persistable object ``name`` tracking ``fields`` (names, or names to defaults)."""
        self._require_open()
        return Persistable(self, name, fields, ttl=ttl)

    async def producer(self, name: str) -> Producer:
        """A new instance of producer ``name`` for sequenced pushes, with an epoch higher
        than every earlier instance's: once it has pushed to a queue, an older instance's
        pushes to that queue raise :class:`ProducerFencedError` (see
        :meth:`Queue.push`). Each call counts up the epoch in Redis."""
        self._require_open()
        key = producer_epoch_key(name)
        shard = await self.placement.locate(f"producer:{name}", key)

        async def next_epoch(client: Any) -> int:
            return int(await client.incr(key))

        epoch = await shard.run(next_epoch, idempotent=False)
        self.placement.remember(key, shard)
        return Producer(name, epoch)

    def service(self, name: str, **options: Any) -> Service:
        """Request/reply service ``name`` (see :class:`~busmq.service.Service`)."""
        self._require_open()
        return Service(self, name, **options)

    @property
    def federation(self) -> FederationManager | None:
        """The federation side of this bus (links, outbox, ``await status()``), once
        configured or used."""
        return self._federation

    def configure_federation(self, settings: FederationSettings) -> FederationManager:
        """Set up federation (see :mod:`busmq.federation`): open links to every target
        and the outbox, and start forwarding what an earlier run left in it. Call from
        a running event loop, once, before :meth:`federate`."""
        from .federation import FederationManager

        self._require_open()
        if self._federation is not None:
            raise BusError("federation is already configured")
        self._federation = FederationManager(self, settings)
        return self._federation

    @overload
    def federate(self, obj: Queue | str, target: str, **kw: Any) -> FederatedQueue: ...
    @overload
    def federate(self, obj: Channel, target: str, **kw: Any) -> FederatedChannel: ...
    @overload
    def federate(self, obj: Persistable, target: str, **kw: Any) -> FederatedPersistable: ...
    @overload
    def federate(self, obj: Service, target: str, **kw: Any) -> FederatedService: ...

    def federate(
        self, obj: Queue | str | Channel | Persistable | Service, target: str, **kw: Any
    ) -> FederatedQueue | FederatedChannel | FederatedPersistable | FederatedService:
        """Use ``obj`` living behind the gateway at ``target`` (``https://host:port``):
        a queue (or queue name), a channel end, a persistable or a service, built on
        this bus as a description (e.g. ``bus.channel("chat", "b", "a")``), comes back
        federated with the same API and events plus the link's (see
        :mod:`busmq.federation`). ``kw`` configures a target that is not in the
        federation settings (``secret=``, ``root_ca_file=``, ...); with no settings,
        defaults are used."""
        from .federation import FederationManager, FederationSettings

        self._require_open()
        if self._federation is None:
            self._federation = FederationManager(self, FederationSettings())
        return self._federation.federate(obj, target, **kw)

    def _require_open(self) -> None:
        if self._state is BusState.CLOSED:
            raise BusClosedError("the bus is closed")

    # -- leases ---------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        await renew_in_slices(self.attached, self.settings.lease_seconds / 3, self._renew)

    async def _renew(self, queues: Sequence[Lease]) -> None:
        results = await asyncio.gather(*(q.renew() for q in queues), return_exceptions=True)
        for queue, result in zip(queues, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("lease renewal of %s failed: %s", queue.name, result)
                queue.events.emit(Event("error", queue.name, error=result))

    # -- state ----------------------------------------------------------------------

    def _track_state(self, event: Event) -> None:
        if self._state in (BusState.CREATED, BusState.CLOSED):
            return
        if event.kind in ("online", "offline"):
            online = all(s.state is ShardState.ONLINE for s in self.shards)
            self._state = BusState.ONLINE if online else BusState.OFFLINE
