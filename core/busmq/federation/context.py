"""What federated objects need of the bus's federation, so that they need not import
the manager that makes them (the manager imports the objects; they import this)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .link import Link

if TYPE_CHECKING:
    from ..context import BusContext
    from .outbox import Outbox


class Reattachable(Protocol):
    """A holder of an attachment to a remote queue."""

    link: Link

    async def reattach(self) -> bool:
        """Attach the remote queue again; whether it is attached now."""
        ...


class FederationContext(Protocol):
    """The bus's federation as its objects see it (:class:`FederationManager` is one)."""

    @property
    def bus(self) -> BusContext: ...

    @property
    def closed(self) -> bool: ...

    @property
    def outbox(self) -> Outbox: ...

    async def ready_outbox(self) -> Outbox:
        """The outbox, once open (raises if it could not be opened)."""
        ...

    def note_attached(self, holder: Reattachable, queue: str, attached: bool) -> None:
        """Record whether ``holder`` holds an attachment to remote ``queue`` (asked to
        attach again when a forwarded push finds the queue gone)."""
