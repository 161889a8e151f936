"""The federation side of a bus: its links, its outbox and their forwarders.

Created by :meth:`busmq.Bus.configure_federation` (or lazily by the first
:meth:`busmq.Bus.federate`) and closed with the bus. Links to every configured target
are opened at once, so they are warm by the time objects are federated, and what an
earlier run left in the outbox starts flowing as soon as its link is ready.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, overload

from ..channel import Channel
from ..channel_protocol import ChannelState
from ..errors import BusError
from ..events import Event
from ..persistable import Persistable
from ..queue import Queue
from ..service import Service
from .context import Reattachable
from .forwarder import Forwarder
from .link import Link, LinkState
from .outbox import DeadLetter, Outbox
from .queue import ConsumerLag, FederatedQueue
from .settings import FederationSettings, FederationTarget, normalize_url

if TYPE_CHECKING:
    from ..context import BusContext
    from .channel import FederatedChannel
    from .persistable import FederatedPersistable
    from .service import FederatedService


class FederatedObject(Protocol):
    """What the manager needs of every federated object."""

    link: Link

    def _on_link_event(self, event: Event) -> None:
        """An event of the object's link (re-emitted on the object's events)."""

    async def _release(self) -> None:
        """Give back what the remote side holds for this object (best effort; the
        manager bounds it with the operation timeout when the bus closes)."""

    async def _stop_local(self) -> None:
        """Stop this process's tasks for the object (no remote call)."""


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueStatus:
    """One federated queue: its link state, what waits in the outbox, consumer lag
    (``None`` if the lag could not be read)."""

    name: str
    state: LinkState
    outbox_depth: int
    lag: ConsumerLag | None


@dataclass(frozen=True)
class ChannelStatus:
    """One federated channel end: the end's state (``connected``, ...), its link's
    state, the sends waiting in the outbox, and how often its stream was reopened."""

    name: str
    role: str
    state: ChannelState
    link_state: LinkState
    outbox_depth: int
    reconnects: int


@dataclass(frozen=True)
class TargetStatus:
    """One gateway: link state, outbox depth (messages and pushes), probes made, and
    its federated queues and channel ends. ``lag_messages`` sums and ``lag_seconds``
    is the largest lag of the queues consumed here."""

    url: str
    state: LinkState
    outbox_depth: int
    outbox_rows: int
    attempts: int
    queues: tuple[QueueStatus, ...]
    channels: tuple[ChannelStatus, ...] = ()
    current_url: str = ""
    """The gateway URL in use (one of the target's URLs; see ``fallback_urls``)."""
    outbox_age: float = 0.0
    """Seconds the oldest push waiting for this target has waited (0 when none)."""
    resumes: int = 0
    """How often this process's consumer streams and channel ends were reopened and
    resumed after a cut."""

    @property
    def lag_messages(self) -> int:
        return sum(q.lag.messages for q in self.queues if q.lag is not None)

    @property
    def lag_seconds(self) -> float:
        return max((q.lag.seconds for q in self.queues if q.lag is not None), default=0.0)


class FederationManager:
    """Links by target URL, the outbox, and the federated objects of one bus."""

    def __init__(self, bus: BusContext, settings: FederationSettings) -> None:
        self.bus = bus
        self.settings = settings
        path = settings.outbox_path or bus.settings.data_dir.parent / "outbox.sqlite3"
        self.outbox = Outbox(
            path, max_messages=settings.outbox_max_messages, max_age=settings.outbox_max_age
        )
        self.outbox.lock()  # now, so that a second user of the file fails at once
        self.outbox.on_change = self._outbox_changed
        self.links: dict[str, Link] = {}
        self.forwarders: dict[str, Forwarder] = {}
        self._queues: weakref.WeakSet[FederatedQueue] = weakref.WeakSet()
        # Every federated object (queues too): link events go to each of its link.
        self._objects: weakref.WeakSet[FederatedObject] = weakref.WeakSet()
        # Holders of attachments to a remote queue, by (target, queue name): asked to
        # attach again when a forwarded push finds the queue gone.
        self._attachments: dict[tuple[str, str], list[Reattachable]] = {}
        self._closed = False
        self._opening = asyncio.ensure_future(self._open_outbox())
        for target in settings.target_map.values():
            self._add(target)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def operation_timeout(self) -> float:
        return self.settings.operation_timeout or self.bus.settings.operation_timeout

    # -- targets --------------------------------------------------------------------

    def link(self, url: str) -> Link:
        """The link of the target that ``url`` names (its ``url`` or one of its
        ``fallback_urls``); ``ValueError`` if no such target is configured."""
        link = self._find(normalize_url(url))
        if link is None:
            raise ValueError(f"no federation target {url!r} is configured")
        return link

    def _find(self, key: str) -> Link | None:
        link = self.links.get(key)
        if link is None:
            link = next((k for k in self.links.values() if key in k.target.urls), None)
        return link

    def _link_for(self, url: str, options: dict[str, Any]) -> Link:
        key = normalize_url(url)
        link = self._find(key)
        if link is not None:
            if options:
                raise ValueError(f"target {key} is already configured; pass no options")
            return link
        return self._add(FederationTarget(key, **options))

    def _add(self, target: FederationTarget) -> Link:
        url = target.url
        link = Link(
            target,
            self.settings,
            operation_timeout=self.operation_timeout,
            outbox_messages=functools.partial(self.outbox.depth, url),
            outbox_rows=functools.partial(self.outbox.rows, url),
        )
        link.events.on(functools.partial(self._dispatch, url))
        forwarder = Forwarder(
            link,
            self.outbox,
            batch_rows=self.settings.forward_batch_rows,
            on_stored=functools.partial(self._stored, url),
            reattach=functools.partial(self._reattach, url),
        )
        self.links[url] = link
        self.forwarders[url] = forwarder
        link.start()
        forwarder.start()
        return link

    # -- objects --------------------------------------------------------------------

    @overload
    def federate(self, obj: Queue | str, target: str, **options: Any) -> FederatedQueue: ...
    @overload
    def federate(self, obj: Channel, target: str, **options: Any) -> FederatedChannel: ...
    @overload
    def federate(self, obj: Persistable, target: str, **options: Any) -> FederatedPersistable: ...
    @overload
    def federate(self, obj: Service, target: str, **options: Any) -> FederatedService: ...

    def federate(
        self, obj: Queue | str | Channel | Persistable | Service, target: str, **options: Any
    ) -> FederatedQueue | FederatedChannel | FederatedPersistable | FederatedService:
        """A federated handle on ``obj`` living behind ``target``: a queue (or a queue
        name), a channel end, a persistable or a service, with the same API and events.
        ``obj`` is only a description (name, roles, fields, options); nothing of it is
        used locally. ``options`` configure a target not in the settings (see
        :class:`FederationTarget`)."""
        if self._closed:
            raise BusError("federation is closed")
        federated: FederatedQueue | FederatedChannel | FederatedPersistable | FederatedService
        if isinstance(obj, Queue | str):
            name = obj.name if isinstance(obj, Queue) else obj
            link = self._link_for(target, options)
            federated = FederatedQueue(self, link, name)
            self._queues.add(federated)
        elif isinstance(obj, Channel):
            from .channel import FederatedChannel

            federated = FederatedChannel(self, self._link_for(target, options), obj)
        elif isinstance(obj, Persistable):
            from .persistable import FederatedPersistable

            federated = FederatedPersistable(self, self._link_for(target, options), obj)
        elif isinstance(obj, Service):
            from .service import FederatedService

            federated = FederatedService(self, self._link_for(target, options), obj)
        else:
            raise TypeError(
                "only queues, channels, persistables and services can be federated, "
                f"not {type(obj).__name__}"
            )
        self.track(federated)
        return federated

    def track(self, obj: FederatedObject) -> None:
        """Route the events of ``obj.link`` to ``obj`` and shut it down with the bus."""
        self._objects.add(obj)

    def note_attached(self, holder: Reattachable, queue: str, attached: bool) -> None:
        """Record whether ``holder`` holds an attachment to remote ``queue``."""
        key = (holder.link.url, queue)
        handles = self._attachments.setdefault(key, [])
        if attached and holder not in handles:
            handles.append(holder)
        elif not attached and holder in handles:
            handles.remove(holder)
        if not handles:
            del self._attachments[key]

    def _dispatch(self, url: str, event: Event) -> None:
        for obj in tuple(self._objects):
            if obj.link.url == url:
                obj._on_link_event(event)

    def _stored(self, url: str, name: str, count: int) -> None:
        for queue in tuple(self._queues):
            if queue.target == url and queue.name == name:
                queue.pushed += count
                return

    async def _reattach(self, url: str, name: str) -> bool:
        for queue in tuple(self._attachments.get((url, name), ())):
            try:
                return await queue.reattach()
            except BusError as exc:
                log.info("re-attaching %s for the outbox failed: %s", name, exc)
        return False

    # -- outbox ---------------------------------------------------------------------

    async def _open_outbox(self) -> None:
        await self.outbox.open()
        for url in self.links:
            self._outbox_changed(url)

    async def ready_outbox(self) -> Outbox:
        """The outbox, once open (raises if it could not be opened)."""
        if not self._opening.done():
            await asyncio.shield(self._opening)
        self._opening.result()  # raises if opening failed
        return self.outbox

    def _outbox_changed(self, url: str) -> None:
        link, forwarder = self.links.get(url), self.forwarders.get(url)
        if link is not None:
            link.note_outbox()
        if forwarder is not None:
            forwarder.wake()

    async def dead_letters(self) -> list[DeadLetter]:
        """Pushes the gateways refused for good, oldest first (see :class:`Outbox`)."""
        outbox = await self.ready_outbox()
        return await outbox.dead_letters()

    async def requeue_dead_letters(
        self,
        seqs: Iterable[int] | None = None,
        *,
        target: str | None = None,
        queue: str | None = None,
    ) -> int:
        """Forward dead letters again, e.g. once the queue they were refused for exists:
        those with the given ``seqs`` (all if ``None``) of ``target``/``queue`` if given
        move to the outbox tail in their original order, keeping their ``request_id``,
        and the forwarders are woken. Returns how many pushes were requeued; raises
        ``OutboxFullError`` (and requeues nothing) if they do not fit in the outbox
        (see :meth:`Outbox.requeue`)."""
        outbox = await self.ready_outbox()
        url = None if target is None else normalize_url(target)
        requeued = await outbox.requeue(seqs, target=url, queue=queue)
        for link_url in self.links if url is None else (url,):
            self._outbox_changed(link_url)
        return requeued

    async def discard_dead_letters(
        self,
        seqs: Iterable[int] | None = None,
        *,
        target: str | None = None,
        queue: str | None = None,
    ) -> int:
        """Delete dead letters for good (selected as in :meth:`requeue_dead_letters`);
        returns how many were deleted."""
        outbox = await self.ready_outbox()
        url = None if target is None else normalize_url(target)
        return await outbox.discard_dead_letters(seqs, target=url, queue=queue)

    # -- status ---------------------------------------------------------------------

    async def status(self) -> list[TargetStatus]:
        """State, outbox depth and consumer lag per target, federated queue and
        channel end."""
        result = []
        for url, link in self.links.items():
            queues = []
            resumes = 0
            for queue in sorted((q for q in self._queues if q.target == url), key=_by_name):
                lag = None
                if queue._last_delivered() is not None and link.usable:
                    try:
                        lag = await queue.lag()
                    except BusError as exc:
                        log.debug("lag of %s: %s", queue.name, exc)
                queues.append(QueueStatus(queue.name, link.state, queue.outbox_depth, lag))
                resumes += sum(c.reconnects for c in queue._consumers)
            channels = tuple(
                ChannelStatus(c.name, c.role, c.state, link.state, c.outbox_depth, c.reconnects)
                for c in sorted(self._channels_of(url), key=_by_name)
            )
            result.append(
                TargetStatus(
                    url,
                    link.state,
                    self.outbox.depth(url),
                    self.outbox.rows(url),
                    link.attempts,
                    tuple(queues),
                    channels,
                    link.current_url,
                    self.outbox.oldest_age(url) or 0.0,
                    resumes + sum(c.reconnects for c in channels),
                )
            )
        return result

    def _channels_of(self, url: str) -> list[FederatedChannel]:
        from .channel import FederatedChannel

        return [o for o in self._objects if isinstance(o, FederatedChannel) and o.link.url == url]

    # -- lifecycle ------------------------------------------------------------------

    async def close(self) -> None:
        """Detach federated queues (best effort, bounded), stop consumers, forwarders
        and links, and close the outbox (what it holds stays for the next run)."""
        if self._closed:
            return
        self._closed = True
        objects = tuple(self._objects)
        try:
            async with asyncio.timeout(self.operation_timeout):
                await asyncio.gather(*(_quietly(o._release()) for o in objects))
        except TimeoutError:
            log.warning("federation: releasing took too long; leases will lapse instead")
        await asyncio.gather(*(_quietly(o._stop_local()) for o in objects))
        await asyncio.gather(*(f.close() for f in self.forwarders.values()))
        await asyncio.gather(*(link.close() for link in self.links.values()))
        await asyncio.gather(self._opening, return_exceptions=True)
        await self.outbox.close()


def _by_name(obj: FederatedQueue | FederatedChannel) -> str:
    return obj.name


async def _quietly(step: Any) -> None:
    try:
        await step
    except BusError as exc:
        log.warning("federation: while closing: %s", exc)
