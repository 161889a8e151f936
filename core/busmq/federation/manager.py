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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import BusError
from ..events import Event
from ..queue import Queue
from .forwarder import Forwarder
from .link import Link, LinkState
from .outbox import Outbox
from .queue import ConsumerLag, FederatedQueue
from .settings import FederationSettings, FederationTarget, normalize_url

if TYPE_CHECKING:
    from ..bus import Bus


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


class Reattachable(Protocol):
    link: Link

    async def reattach(self) -> bool:
        """Attach the remote queue again; whether it is attached now."""


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
class TargetStatus:
    """One gateway: link state, outbox depth (messages and pushes), probes made, and
    its federated queues. ``lag_messages`` sums and ``lag_seconds`` is the largest lag
    of the queues consumed here."""

    url: str
    state: LinkState
    outbox_depth: int
    outbox_rows: int
    attempts: int
    queues: tuple[QueueStatus, ...]

    @property
    def lag_messages(self) -> int:
        return sum(q.lag.messages for q in self.queues if q.lag is not None)

    @property
    def lag_seconds(self) -> float:
        return max((q.lag.seconds for q in self.queues if q.lag is not None), default=0.0)


class FederationManager:
    """Links by target URL, the outbox, and the federated objects of one bus."""

    def __init__(self, bus: Bus, settings: FederationSettings) -> None:
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
        """The link to ``url``; ``ValueError`` if that target is not configured."""
        link = self.links.get(normalize_url(url))
        if link is None:
            raise ValueError(f"no federation target {url!r} is configured")
        return link

    def _link_for(self, url: str, options: dict[str, Any]) -> Link:
        key = normalize_url(url)
        link = self.links.get(key)
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

    def federate(self, obj: Queue | str, target: str, **options: Any) -> FederatedQueue:
        """A federated handle on ``obj`` (a queue or a queue name) living behind
        ``target``; ``options`` configure a target not in the settings (see
        :class:`FederationTarget`)."""
        if self._closed:
            raise BusError("federation is closed")
        if isinstance(obj, Queue):
            name = obj.name
        elif isinstance(obj, str):
            name = obj
        else:
            raise TypeError(f"only queues can be federated for now, not {type(obj).__name__}")
        queue = FederatedQueue(self, self._link_for(target, options), name)
        self._queues.add(queue)
        self.track(queue)
        return queue

    def track(self, obj: FederatedObject) -> None:
        """Route the events of ``obj.link`` to ``obj`` and shut it down with the bus."""
        self._objects.add(obj)

    def _attached(self, holder: Reattachable, queue: str, attached: bool) -> None:
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

    # -- status ---------------------------------------------------------------------

    async def status(self) -> list[TargetStatus]:
        """State, outbox depth and consumer lag per target and federated queue."""
        result = []
        for url, link in self.links.items():
            queues = []
            for queue in sorted((q for q in self._queues if q.target == url), key=_by_name):
                lag = None
                if queue._last_delivered is not None and link.usable:
                    try:
                        lag = await queue.lag()
                    except BusError as exc:
                        log.debug("lag of %s: %s", queue.name, exc)
                queues.append(QueueStatus(queue.name, link.state, queue.outbox_depth, lag))
            result.append(
                TargetStatus(
                    url,
                    link.state,
                    self.outbox.depth(url),
                    self.outbox.rows(url),
                    link.attempts,
                    tuple(queues),
                )
            )
        return result

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


def _by_name(queue: FederatedQueue) -> str:
    return queue.name


async def _quietly(step: Any) -> None:
    try:
        await step
    except BusError as exc:
        log.warning("federation: while closing: %s", exc)
