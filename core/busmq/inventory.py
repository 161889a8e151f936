"""What the bus holds, for operators: every queue's name, its counts, and its messages
read without consuming them.

Queues are found by scanning each shard for their info hashes (``SCAN`` with ``MATCH`` and
``TYPE``, never ``KEYS``), and their figures are read in pipelines of a bounded number of
queues, so a bus of 10,000 queues costs a few dozen round trips and no blocking command.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from .controls import RateLimit
from .keys import CONSUMER_GROUP, DEAD_SUFFIX, PREFIX, QueueKeys
from .message import Message, decode_entry

if TYPE_CHECKING:
    from .queue_store import QueueStore
    from .shard import Shard

SCAN_COUNT = 1000
MAX_STREAM_SEQ = 2**64 - 1
PIPELINE_QUEUES = 250
"""Queues whose figures one pipeline reads."""
COMMANDS_PER_QUEUE = 9

_INFO_MATCH = f"{PREFIX}:{{*:i"


@dataclass(frozen=True)
class QueueStats:
    """A queue's figures, as Redis holds them (every process's doing, not this one's).

    Attributes:
        name: the queue name.
        shard: the label of the shard that holds it.
        messages: entries in the stream (ready, pending, or kept for replay).
        ready: messages not yet delivered (the queue's depth).
        pending: at-least-once deliveries not acked yet.
        oldest_pending_seconds: how long the oldest unacked delivery has waited since
            it was (last) delivered; 0 when nothing is pending.
        consumers: consumers registered with the queue (removed once idle with nothing
            pending).
        attachments: live attachments (clients holding the queue open).
        delayed: delayed messages and retries waiting for their time.
        dead_letters: messages in its dead-letter queue.
        last_id: the id of the last message pushed: the queue's pushed total.
        delivered: hand-outs to consumers since the queue was created (Redis 7+; 0
            before).
        mode: the consumption mode fixed by the first consumer, if any.
        paused: whether deliveries are paused.
        ttl: seconds until the queue expires if no attachment is renewed.
        dead_lettered: messages ever moved to its dead-letter queue (that queue's last
            id: requeues and purges do not lower it).
        rate_limit: the queue's delivery rate limit, if any.
        key_rate_limit: its per-header-value rate limit, if any.
        ordering: the header whose value orders it per key, if any.
        ordered_keys_in_flight: with ordering, keys with a delivery in flight.
        ordered_waiting: with ordering, messages waiting for their key.
    """

    name: str
    shard: str
    messages: int
    ready: int
    pending: int
    oldest_pending_seconds: float
    consumers: int
    attachments: int
    delayed: int
    dead_letters: int
    last_id: int
    delivered: int
    mode: str | None
    paused: bool
    ttl: float
    dead_lettered: int = 0
    rate_limit: RateLimit | None = None
    key_rate_limit: RateLimit | None = None
    ordering: str | None = None
    ordered_keys_in_flight: int = 0
    ordered_waiting: int = 0

    @property
    def is_dead_letter_queue(self) -> bool:
        return self.name.endswith(DEAD_SUFFIX)


def queue_name_of(info_key: bytes | str) -> str | None:
    """``busmq:{orders}:i`` -> ``orders``; ``busmq:{orders}:dead:i`` -> ``orders:dead``."""
    key = info_key.decode() if isinstance(info_key, bytes) else info_key
    head = f"{PREFIX}:{{"
    if not key.startswith(head) or not key.endswith(":i") or "}" not in key:
        return None
    base, _, suffix = key[len(head) : -2].partition("}")
    if suffix and not suffix.startswith(":"):
        return None
    return base + suffix


async def scan_queue_names(shard: Shard) -> list[str]:
    """The names of the queues ``shard`` holds, sorted."""

    async def scan(client: aioredis.Redis) -> list[str]:
        names = set()
        async for key in client.scan_iter(match=_INFO_MATCH, count=SCAN_COUNT, _type="HASH"):
            name = queue_name_of(key)
            if name is not None:
                names.add(name)
        return sorted(names)

    return await shard.run(scan, idempotent=True, timeout=_long(shard))


async def read_stats(shard: Shard, names: Sequence[str]) -> list[QueueStats]:
    """The figures of the queues ``names`` on ``shard``; queues that vanished meanwhile
    are left out. Dead-letter counts are filled in from the ``<name>:dead`` queues
    among ``names`` (see :func:`with_dead_letters`)."""
    result: list[QueueStats] = []
    for start in range(0, len(names), PIPELINE_QUEUES):
        chunk = names[start : start + PIPELINE_QUEUES]
        replies = await shard.run(
            functools.partial(_read_chunk, names=chunk), idempotent=True, timeout=_long(shard)
        )
        for index, name in enumerate(chunk):
            at = index * COMMANDS_PER_QUEUE
            stats = _parse(name, shard.label, replies[at : at + COMMANDS_PER_QUEUE])
            if stats is not None:
                result.append(stats)
    return with_dead_letters(result)


async def all_stats(shards: Sequence[Shard]) -> list[QueueStats]:
    """The figures of every queue of the bus whose shards are ``shards``, by name."""
    found: list[QueueStats] = []
    for shard in shards:
        found += await read_stats(shard, await scan_queue_names(shard))
    return sorted(found, key=lambda s: s.name)


@dataclass(frozen=True)
class QueuePage:
    """One page of :func:`list_stats`: the queues, how many match the prefix on every
    page together, and the name to pass as ``after`` for the next page (``None`` on the
    last)."""

    queues: list[QueueStats]
    total: int
    next_after: str | None


async def list_stats(
    shards: Sequence[Shard],
    *,
    prefix: str = "",
    after: str = "",
    limit: int = 0,
    include: Callable[[str], bool] | None = None,
) -> QueuePage:
    """The figures of the queues whose name starts with ``prefix`` (and that
    ``include`` accepts), by name, from the first name after ``after``, at most
    ``limit`` of them (0: all). Every shard's names are scanned (cheap: names only);
    figures are read for the page alone."""
    if limit < 0:
        raise ValueError("limit must not be negative")
    located: list[tuple[str, Shard]] = []
    for shard in shards:
        located += [(name, shard) for name in await scan_queue_names(shard)]
    present = {name for name, _ in located}
    matching = sorted(
        p for p in located if p[0].startswith(prefix) and (include is None or include(p[0]))
    )
    located = [p for p in matching if p[0] > after]
    page = located[:limit] if limit else located
    names_by_shard: dict[Shard, list[str]] = {}
    for name, shard in page:
        names_by_shard.setdefault(shard, []).append(name)
        if name + DEAD_SUFFIX in present:  # read too: its dead letters count with it
            names_by_shard[shard].append(name + DEAD_SUFFIX)
    wanted = {name for name, _ in page}
    found: list[QueueStats] = []
    for shard, names in names_by_shard.items():
        found += [s for s in await read_stats(shard, sorted(set(names))) if s.name in wanted]
    more = bool(limit) and len(located) > limit
    next_after = page[-1][0] if more else None
    return QueuePage(sorted(found, key=lambda s: s.name), len(matching), next_after)


def with_dead_letters(stats: list[QueueStats]) -> list[QueueStats]:
    """``stats`` with each queue's ``dead_letters`` and ``dead_lettered`` taken from its
    dead-letter queue (``messages`` and ``last_id``), when that queue is among them."""
    dead = {s.name[: -len(DEAD_SUFFIX)]: s for s in stats if s.is_dead_letter_queue}
    if not dead:
        return stats
    return [
        s
        if s.name not in dead
        else dataclasses.replace(
            s, dead_letters=dead[s.name].messages, dead_lettered=dead[s.name].last_id
        )
        for s in stats
    ]


async def _read_chunk(client: aioredis.Redis, names: Sequence[str]) -> list[Any]:
    """One pipeline, :data:`COMMANDS_PER_QUEUE` replies per queue in ``names``."""
    pipe = client.pipeline(transaction=False)
    now_ms = int(time.time() * 1000)
    for name in names:
        keys = QueueKeys(name)
        pipe.hmget(keys.info, "seq", "mode", "paused", "rate", "krate", "order")
        pipe.pttl(keys.info)
        pipe.xlen(keys.stream)
        pipe.zcard(keys.due)
        pipe.xinfo_groups(keys.stream)
        pipe.xpending_range(keys.stream, CONSUMER_GROUP, min="-", max="+", count=1)
        pipe.zcount(keys.leases, f"({now_ms}", "+inf")
        pipe.hlen(keys.held)
        pipe.zcard(keys.blocked)
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    return replies


def _parse(name: str, shard: str, replies: list[Any]) -> QueueStats | None:
    conf, ttl_ms, length, delayed, groups, oldest, attachments, held, waiting = replies
    if not isinstance(conf, list) or conf[0] is None:
        return None
    messages = _int(length)
    group = _group(groups)
    pending = _int(group.get("pending")) if group else 0
    ready = messages
    delivered = 0
    if group:
        lag = group.get("lag")
        delivered = _int(group.get("entries-read"))
        ready = _int(lag) if lag is not None else max(messages - pending, 0)
    oldest_seconds = 0.0
    if pending and isinstance(oldest, list) and oldest:
        oldest_seconds = _int(oldest[0].get("time_since_delivered")) / 1000
    mode = conf[1].decode() if isinstance(conf[1], bytes) else None
    return QueueStats(
        name=name,
        shard=shard,
        messages=messages,
        ready=ready,
        pending=pending,
        oldest_pending_seconds=oldest_seconds,
        consumers=_int(group.get("consumers")) if group else 0,
        attachments=_int(attachments),
        delayed=_int(delayed),
        dead_letters=0,
        last_id=int(conf[0]),
        delivered=delivered,
        mode=mode,
        paused=conf[2] is not None,
        ttl=max(_int(ttl_ms), 0) / 1000,
        rate_limit=RateLimit.decode(conf[3]),
        key_rate_limit=RateLimit.decode(conf[4]),
        ordering=conf[5].decode() if isinstance(conf[5], bytes) else None,
        # two fields per key held, one per waiting entry, maybe a pin (lua/prelude.lua)
        ordered_keys_in_flight=max(_int(held) - _int(waiting), 0) // 2,
        ordered_waiting=_int(waiting),
    )


def _group(groups: Any) -> dict[str, Any] | None:
    if not isinstance(groups, list):
        return None
    for group in groups:
        if isinstance(group, dict) and group.get("name") in (
            CONSUMER_GROUP,
            CONSUMER_GROUP.encode(),
        ):
            return group
    return None


def _int(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        try:
            return int(value)
        except ValueError:
            return 0
    return 0


async def _xrange(
    client: aioredis.Redis, *, stream: str, start: str, end: str, count: int
) -> list[Any]:
    entries = await client.xrange(stream, start, end, count=count)
    return list(entries or [])


def _long(shard: Shard) -> float:
    """Scans and bulk reads get more time than one command: ten operation timeouts."""
    return shard.operation_timeout * 10


async def browse(
    queue: QueueStore,
    from_id: int = 0,
    to_id: int | None = None,
    *,
    follow: bool = False,
    page: int = 500,
) -> AsyncIterator[Message]:
    """The stored messages of ``queue`` from the stream position of ``from_id`` up to
    that of ``to_id`` (inclusive), in stream order, without consuming or acknowledging
    anything; with ``follow``, then each new one as it is stored, until cancelled (see
    :meth:`Queue.browse`)."""
    async for messages in browse_pages(queue, from_id, to_id, follow=follow, page=page):
        for message in messages:
            yield message


async def browse_pages(
    queue: QueueStore,
    from_id: int = 0,
    to_id: int | None = None,
    *,
    follow: bool = False,
    page: int = 500,
) -> AsyncIterator[list[Message]]:
    """:func:`browse` a page (one ``XRANGE``) at a time: never an empty page."""
    if from_id < 0 or (to_id is not None and to_id < from_id):
        raise ValueError("need 0 <= from_id <= to_id")
    if from_id > MAX_STREAM_SEQ:
        raise ValueError(f"from_id must be at most {MAX_STREAM_SEQ}")
    if follow and to_id is not None:
        raise ValueError("follow reads on without an end: give no to_id")
    if page < 1:
        raise ValueError("page must be at least 1")
    stream = queue.keys.stream
    start = f"{from_id}-0"
    # The last id a stream can hold is 2**64 - 1: a to_id at or past it has no end.
    end = "+" if to_id is None or to_id >= MAX_STREAM_SEQ else f"({to_id + 1}-0"
    shard = await queue.located() if follow else None
    wake = await shard.notifier.watch(queue.name) if shard is not None else None
    try:
        while True:
            if wake is not None:
                wake.clear()  # before reading, so a push during the read is not missed
            entries = await queue.run(
                functools.partial(_xrange, stream=stream, start=start, end=end, count=page),
                idempotent=True,
            )
            if entries:
                yield [decode_entry(entry_id, fields) for entry_id, fields in entries]
                last = entries[-1][0]
                start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
            elif wake is None:
                return
            else:
                await wake.wait()
    finally:
        if shard is not None and wake is not None:
            await shard.notifier.unwatch(queue.name, wake)
