"""What a destructive consumer asks of its queue's consumer group (Redis scripts):
take over overdue deliveries, give back what it holds, leave the group when it closes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import RedisCommandError
from .message import Message, decode_entry
from .reads import GroupMissing

if TYPE_CHECKING:
    from .queue_store import QueueStore

FORGET_CONSUMER_MS = 3_600_000
"""A consumer idle this long with nothing pending is removed from the group by any
other consumer's claim (one that ended without leaving: its process died)."""


async def claim(
    queue: QueueStore,
    consumer: str,
    count: int,
    visibility_timeout: float,
    max_deliveries: int | None,
) -> list[tuple[Message, int]]:
    """Up to ``count`` deliveries pending longer than ``visibility_timeout``, taken over by
    ``consumer``, with their delivery counts, in id order (``claim.lua``: those past
    ``max_deliveries`` go to the dead letters instead)."""
    limit = "" if max_deliveries is None else str(max_deliveries)
    args: list[str | int] = [
        consumer,
        int(visibility_timeout * 1000),
        count,
        FORGET_CONSUMER_MS,
        limit,
        queue.name,
    ]
    try:
        flat: list[Any] = await queue.run_fast(
            lambda c: queue.bus.scripts.call(c, "claim", queue.keys.with_dead_letters(), args),
            idempotent=True,
        )
    except RedisCommandError as exc:
        if str(exc).startswith("NOGROUP"):  # the stream is gone, as a read would find
            raise GroupMissing from None
        raise
    taken = []
    for i in range(0, len(flat), 3):
        entry_id, times, raw = flat[i], int(flat[i + 1]), flat[i + 2]
        fields = dict(zip(raw[::2], raw[1::2], strict=True))
        taken.append((decode_entry(entry_id, fields), times))
    taken.sort(key=lambda t: t[0].id)
    return taken


async def release_pending(queue: QueueStore, consumer: str, *, unless_ordered: bool = False) -> int:
    """Give back everything pending for ``consumer`` (``release.lua``), or with
    ``unless_ordered`` nothing if the queue is ordered per key; how many."""
    args = [consumer, "1" if unless_ordered else ""]
    released: int = await queue.run(
        lambda c: queue.bus.scripts.call(c, "release", queue.keys.all(), args),
        idempotent=True,
    )
    if released:
        queue.read_in_full()
    return released


async def leave(queue: QueueStore, consumer: str) -> None:
    """Remove ``consumer`` from the group if nothing is pending for it (``leave.lua``)."""
    await queue.run_fast(
        lambda m: queue.bus.scripts.call(m, "leave", [queue.keys.stream], [consumer]),
        idempotent=True,
    )
