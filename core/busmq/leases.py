"""Queue leases: the attach script's calls, for this process's attachments
(:class:`~busmq.queue.LocalQueueBackend`) and for attachments held on behalf of clients
elsewhere.

A process that attaches for a client who renews by itself (the gateway, for its remote
clients) names the lease's member and hands it to that client, so that any process on the
same Redis renews or releases it: no process keeps such an attachment in memory, and a
client that stops renewing lets its lease lapse in Redis.
"""

from __future__ import annotations

import enum

from .queue_api import Retention
from .queue_store import QueueStore

__all__ = ["Renewal", "hold", "lease", "limit_args", "release_held", "renew_held"]

CREATE, RENEW, RENEW_HELD = "1", "0", "2"
NO_LIMITS = ("", "", "")


class Renewal(enum.Enum):
    """What :func:`renew_held` found."""

    RENEWED = "renewed"
    LAPSED = "lapsed"  # released, or not renewed within its lease
    QUEUE_GONE = "queue_gone"


async def lease(
    store: QueueStore, member: str, mode: str, ttl_ms: str, limits: tuple[str, str, str]
) -> tuple[int, int]:
    """Run the attach script for ``member``: ``(created, attachments)``, ``created`` -1
    when the queue is gone (no create), -2 when a held lease lapsed (:data:`RENEW_HELD`)."""
    bus = store.bus
    keys = store.keys.with_dead_letters()
    args: list[str | int] = [member, ms(bus.settings.lease_seconds), ttl_ms, mode, *limits]
    # On the fast connection: the bus renews every attached queue at once, and a burst of
    # redis-py calls would stall the loop for milliseconds.
    reply = await store.run_fast(
        lambda c: bus.scripts.call(c, "attach", keys, args), idempotent=True
    )
    return int(reply[0]), int(reply[1])


async def hold(
    store: QueueStore,
    member: str,
    *,
    ttl: float | None = None,
    retention: Retention | None = None,
    max_backlog: int | None = None,
) -> bool:
    """Attach ``member`` to the queue (creating it); whether it was created. The lease
    lasts ``BusSettings.lease_seconds`` unless renewed by :func:`renew_held`."""
    ttl_ms = ms(ttl if ttl is not None else store.bus.settings.default_ttl)
    if ttl_ms < 1:
        raise ValueError("ttl must be positive")
    shard = store.shard = await store.locate()
    created, _ = await lease(store, member, CREATE, str(ttl_ms), limit_args(retention, max_backlog))
    store.bus.placement.remember(store.keys.info, shard)
    return bool(created)


async def renew_held(store: QueueStore, member: str) -> Renewal:
    """Renew a lease taken by :func:`hold`, only while it is still held."""
    created, _ = await lease(store, member, RENEW_HELD, "", NO_LIMITS)
    if created == -1:
        return Renewal.QUEUE_GONE
    return Renewal.LAPSED if created == -2 else Renewal.RENEWED


async def release_held(store: QueueStore, member: str) -> None:
    """Release a lease taken by :func:`hold` (a no-op once released or lapsed)."""
    keys = store.keys.all()
    await store.run(lambda c: store.bus.scripts.call(c, "detach", keys, [member]), idempotent=True)


def ms(seconds: float) -> int:
    return int(seconds * 1000)


def limit_args(retention: Retention | None, max_backlog: int | None) -> tuple[str, str, str]:
    if retention is None:
        maxlen = maxage = ""
    else:
        maxlen = str(retention.max_length or 0)
        maxage = str(ms(retention.max_age) if retention.max_age else 0)
    backlog = "" if max_backlog is None else str(max_backlog)
    return maxlen, maxage, backlog
