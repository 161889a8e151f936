"""Per-principal quotas on what its attachments create and keep alive (``max_queues``,
``max_backlog`` in the principals file). Past one, the call ends ``RESOURCE_EXHAUSTED``
with ``ErrorInfo`` naming the quota, logged and counted as a refusal.

Like the other per-principal limits, they hold per gateway process: with ``--workers N``
each worker counts its own attachments.
"""

from __future__ import annotations

from .access import LimitExceeded, refuse
from .principals import Principal


def backlog_for(principal: Principal, requested: int | None) -> int | None:
    """The ``max_backlog`` an attach by ``principal`` gives its queue: ``requested``
    (``None`` keeps the queue's, ``0`` removes it), within the principal's ceiling; a
    principal with a ceiling always sets a limit, the ceiling when it asked none."""
    ceiling = principal.max_backlog
    if not ceiling:
        return requested
    if requested is None:
        return ceiling
    if requested == 0 or requested > ceiling:
        asked = "no backlog limit" if requested == 0 else f"max_backlog {requested}"
        raise refuse(
            LimitExceeded(
                f"principal {principal.name!r} may not set {asked}: its quota is "
                f"max_backlog {ceiling}",
                "BACKLOG_QUOTA",
                {"principal": principal.name, "max_backlog": str(ceiling)},
            ),
            asked,
        )
    return requested


def check_queue_quota(principal: Principal, held: int, queue: str) -> None:
    """Refuse an attach that would have ``principal`` hold more than ``max_queues``
    queues (``held``: how many it holds now, ``queue`` not among them)."""
    limit = principal.max_queues
    if limit and held >= limit:
        raise refuse(
            LimitExceeded(
                f"principal {principal.name!r} holds {held} queues, its quota (max_queues): "
                "detach one first",
                "QUEUE_QUOTA",
                {"principal": principal.name, "max_queues": str(limit)},
            ),
            f"attach {queue!r} over max_queues {limit}",
        )
