"""What the push paths need of a link, so that the link can own them without an
import circle (the link imports the push paths; they import this)."""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from .settings import FederationTarget


class LinkCalls(Protocol):
    """A link as a maker of calls (:class:`~busmq.federation.Link` is one)."""

    url: str
    target: FederationTarget
    metadata: tuple[tuple[str, str], ...]
    operation_timeout: float

    @property
    def current_url(self) -> str:
        """The URL the link's channels are on now (one of the target's)."""
        ...

    def stub(self, kind: type[Any] | None = None) -> Any:
        """A stub of service ``kind`` on the next channel of the pool."""

    def report(self, error: grpc.aio.AioRpcError) -> None:
        """A call failed: the link re-probes, or marks itself unauthorized."""

    def report_code(self, code: grpc.StatusCode) -> None:
        """:meth:`report` for a failure known by its code alone."""
