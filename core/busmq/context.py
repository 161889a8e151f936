"""What the bus's objects (queues, consumers, channels, services, persistables) need
from the bus that made them, as a protocol: they depend on these parts, not on
:class:`~busmq.bus.Bus`, which composes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .events import Event, EventHub
    from .placement import Placement
    from .schemas import ValidatorCache
    from .scripts import Scripts
    from .settings import BusSettings
    from .stats import ProcessCounters
    from .tracing import Tracing


class Lease(Protocol):
    """An attachment whose lease the bus renews (a :class:`~busmq.queue.Queue`)."""

    name: str
    events: EventHub[Event]

    @property
    def auto_renew(self) -> bool: ...

    async def renew(self) -> bool: ...

    async def detach(self) -> None: ...


class BusContext(Protocol):
    settings: BusSettings
    client_id: str
    """Unique per bus instance: names this process's attachments and consumers."""
    scripts: Scripts
    placement: Placement
    attached: set[Lease]
    """Queues attached through this bus, whose leases it renews."""
    counters: ProcessCounters
    """What this process pushed, delivered, acked... per queue (:mod:`busmq.stats`)."""
    schemas: ValidatorCache
    """Compiled schema validators and each queue's schema version as last learned."""
    tracing: Tracing | None
    """OpenTelemetry propagation, when ``BusSettings.tracing`` is on."""

    @property
    def closed(self) -> bool: ...
