"""The reads a consumer makes of its queue, on the queue's store: the read script (the
processing controls applied), the lean ``XREADGROUP`` (no control applies), and replay's
``XREAD`` from a cursor. They return Redis's entries; the consumer makes deliveries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import redis.exceptions as rex

from .errors import QueueNotFoundError, RedisCommandError
from .keys import CONSUMER_GROUP
from .message import stream_entries

if TYPE_CHECKING:
    from .mux import MuxClient
    from .queue_store import QueueStore

_GROUP = CONSUMER_GROUP.encode()
_ORIGINAL_ID = b"i"  # the field of a delayed message stored after later ones


class GroupMissing(Exception):
    """The consumer group vanished (the stream expired or was recreated)."""


class FullRead(NamedTuple):
    """What ``read.lua`` returned."""

    entries: list[Any]
    retried: list[Any]
    """As (id, fields, delivery count)."""
    wait: int
    """Milliseconds until something is due, -1 nothing is, -2 the queue is paused."""
    lean: bool
    """No control applies: the lean read may follow."""
    last: int
    """The position of the last entry its ``XREADGROUP`` read, handed out or not (0:
    none): every message up to it was read by the group (``WakeUp.cover``)."""


async def read_full(store: QueueStore, consumer: str, count: int, noack: bool) -> FullRead:
    """``read.lua``: new entries and due retries, the processing controls applied."""
    args: list[str | int] = [consumer, count, "1" if noack else "0", store.name]
    keys = store.keys.with_dead_letters()
    try:
        entries, retried, wait, *rest = await store.run_fast(
            lambda m: store.bus.scripts.call(m, "read", keys, args), idempotent=True
        )
    except RedisCommandError as exc:
        if str(exc).startswith("NOGROUP"):  # the stream is gone: check, recreate
            raise GroupMissing from None
        raise store.script_error(exc) from None  # ORDERED: at-most-once on an ordered queue
    lean, last = [*rest, 0, 0][:2]  # a paused queue's read returns neither
    return FullRead(_entries(entries), retried, int(wait), bool(lean), int(last))


def _entries(flat: list[Any]) -> list[tuple[bytes, list[bytes]]]:
    """``read.lua``'s entries, flat (id, number of fields, names and values, ...), as
    (id, fields) pairs."""
    entries = []
    at, end = 0, len(flat)
    while at < end:
        count = flat[at + 1]
        entries.append((flat[at], flat[at + 2 : at + 2 + count]))
        at += 2 + count
    return entries


async def read_lean(store: QueueStore, consumer: str, count: int, noack: bool) -> list[Any]:
    """A plain ``XREADGROUP`` (see :mod:`busmq.consumer`). At-most-once deletes what it
    read with the connection's next write (``MuxClient.defer``: no write of its own under
    load, at most ``DEFER_SECONDS`` later when idle); a count or ``close()`` sends it
    first."""
    keys = store.keys
    stream = keys.stream
    read: tuple[Any, ...] = (b"XREADGROUP", b"GROUP", _GROUP, consumer, b"COUNT", count)
    read += (b"NOACK", b"STREAMS", stream, b">") if noack else (b"STREAMS", stream, b">")

    async def run(mux: MuxClient) -> list[Any]:
        entries = stream_entries(await mux.execute(*read))
        if noack and entries:
            mux.defer(b"XDEL", stream, *[entry[0] for entry in entries])
            originals = [_original_id(f) for _, f in entries if len(f) > 6]
            if any(originals):  # promoted by another consumer's full read meanwhile
                mux.defer(b"HDEL", keys.alias, *[o for o in originals if o])
        return entries

    try:
        return await store.run_fast(run, idempotent=True)
    except RedisCommandError as exc:
        if str(exc).startswith("NOGROUP"):  # the stream is gone: check, recreate
            raise GroupMissing from None
        raise


async def read_replay(store: QueueStore, cursor: str, count: int) -> tuple[list[Any], int]:
    """Replay: ``XREAD`` after ``cursor``, storing delayed messages now due first when
    some wait; (entries, ms until the next one is due or -1)."""

    async def read(mux: MuxClient) -> tuple[Any, bool]:
        keys = store.keys
        exists, entries, due = await mux.execute_many(
            [
                (b"EXISTS", keys.info),
                (b"XREAD", b"COUNT", count, b"STREAMS", keys.stream, cursor),
                (b"EXISTS", keys.due),
            ]
        )
        for result in (exists, entries, due):
            if isinstance(result, rex.RedisError):
                raise result
        if not exists:  # a missing stream reads as empty: notice a closed queue instead
            raise QueueNotFoundError(store.name)
        return entries, bool(due)

    reply, has_due = await store.run_fast(read, idempotent=True)
    wait = -1
    if has_due:  # delayed messages wait outside the stream: store those now due
        wait = int(
            await store.run_fast(
                lambda m: store.bus.scripts.call(m, "promote", store.keys.all(), [count]),
                idempotent=True,
            )
        )
    return stream_entries(reply), wait


def _original_id(flat: Sequence[bytes]) -> bytes | None:
    for i in range(0, len(flat), 2):
        if flat[i] == _ORIGINAL_ID:
            return flat[i + 1]
    return None
