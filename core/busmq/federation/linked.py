"""What every federated object shows of its link."""

from __future__ import annotations

from .link import Link, LinkState


class Linked:
    """A federated object's ``target`` and link ``state``.

    Attributes:
        link: the :class:`~busmq.federation.Link` to the gateway.
    """

    link: Link

    @property
    def target(self) -> str:
        """The gateway URL."""
        return self.link.url

    @property
    def state(self) -> LinkState:
        """The link's state (``ready``, ``disconnected``, ...)."""
        return self.link.state
