"""Processing controls of a queue: dead letters, retries with backoff, delayed delivery,
expiry, rate limits and pause.

All of it is Redis data beside the queue's stream, changed by Lua scripts that touch
keys of one hash tag only (see :class:`busmq.keys.QueueKeys`), so every step is atomic
and works on Redis Cluster:

- **Dead letters** go to queue ``<name>:dead`` (same hash tag): a normal queue whose
  messages carry ``busmq-dead-*`` headers saying why, from where, and how often they
  were delivered. :meth:`Queue.requeue_dead` moves them back as new messages.
- **Retries** (``nack(delay=...)``, :class:`RetryPolicy`) take the delivery out of the
  pending list and park it in the ``due`` sorted set; the read script of whichever
  consumer reads after it is due gives it back with its delivery count.
- **Delayed messages** get their id at push and wait in ``delayed``/``due``; the read
  script stores them in the stream when due, after everything stored so far.
- **Rate limits** are token buckets in the queue's info hash (per key: a hash of
  buckets), spent by the read script: every consumer process shares them.
- **Pause** is a flag in the info hash: the read script returns nothing while it is set.

No scheduler process is involved: consumers promote what is due when they read, and
sleep until the next due time the read script reports.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from .errors import QueueNotFoundError, RedisCommandError
from .keys import CONSUMER_GROUP, QueueKeys, dead_letter_name
from .ordering import OrderingState, read_state
from .queue_schema import SCHEMA_ATTEMPTS, fitting_dead_letters, learn_schema

if TYPE_CHECKING:
    from .queue_store import QueueStore

DEAD_HEADERS = (
    "busmq-dead-reason",
    "busmq-dead-queue",
    "busmq-dead-id",
    "busmq-dead-deliveries",
    "busmq-dead-at",
    "busmq-dead-first-delivery",
    "busmq-dead-last-delivery",
    "busmq-dead-error",
)
"""Headers a dead letter carries: why (``max-deliveries``, ``rejected``, ``expired``),
the queue and id it had, how often it was delivered, when it died, its first and last
delivery (Unix ms) and the last error its consumer gave."""

REQUEUED_HEADER = "busmq-requeued-id"
"""Header of a requeued dead letter: the id it had in the queue before it died."""

MAX_ERROR_TEXT = 1024


@dataclass(frozen=True)
class RetryPolicy:
    """How long a failed delivery waits before it is delivered again: ``initial`` seconds
    after the first delivery, multiplied by ``factor`` for each further one, at most
    ``max_delay``; ``jitter`` (0-1) spreads each delay by up to that fraction, so a
    fleet of retries does not come back at one instant."""

    initial: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in (self.initial, self.factor, self.max_delay)):
            raise ValueError("RetryPolicy values must be finite numbers")
        if self.initial < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy delays must not be negative")
        if self.factor < 1:
            raise ValueError("RetryPolicy.factor must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("RetryPolicy.jitter must be between 0 and 1")

    def delay(self, delivery_count: int) -> float:
        """Seconds to wait after delivery number ``delivery_count`` failed."""
        base = min(self.initial * self.factor ** max(delivery_count - 1, 0), self.max_delay)
        if self.jitter:
            base *= 1 - self.jitter * random.random()
        return base


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` deliveries per ``per_seconds``, for every consumer together
    (a token bucket of ``limit`` tokens refilled over ``per_seconds``). With ``key``,
    the limit applies to each value of that header separately (e.g. per tenant)."""

    limit: int
    per_seconds: float = 1.0
    key: str | None = None

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError("RateLimit.limit must be at least 1")
        if not math.isfinite(self.per_seconds) or self.per_seconds <= 0:
            raise ValueError("RateLimit.per_seconds must be positive")
        if self.key is not None and (not self.key or " " in self.key):
            raise ValueError("RateLimit.key must be a header name without spaces")

    def encode(self) -> str:
        spec = f"{self.limit} {int(self.per_seconds * 1000)}"
        return spec if self.key is None else f"{self.key} {spec}"

    @classmethod
    def decode(cls, raw: bytes | str | None) -> RateLimit | None:
        if not raw:
            return None
        text = raw.decode() if isinstance(raw, bytes) else raw
        *key, limit, per_ms = text.rsplit(" ", 2)
        return cls(int(limit), int(per_ms) / 1000, key[0] if key else None)


@dataclass(frozen=True)
class QueueInfo:
    """What a queue holds and how it is controlled, read in one round trip."""

    name: str
    count: int
    """Messages stored in the stream (ready, delivered-but-unacked, or history)."""
    pending: int
    """At-least-once deliveries handed out and not yet acked."""
    delayed: int
    """Messages and retries waiting for their due time (a delivery given back at once
    counts here until the next read takes it)."""
    dead_letters: int
    """Messages in the dead-letter queue."""
    last_id: int
    ttl: float
    """Seconds until the queue expires if no attachment is renewed."""
    mode: str | None
    paused: bool
    rate_limit: RateLimit | None
    key_rate_limit: RateLimit | None
    max_deliveries: int | None
    drop_expired: bool
    ordering: str | None = None
    """The header whose value orders the queue per key (:meth:`Queue.set_ordering`)."""
    ordering_state: OrderingState | None = None
    """With ordering: keys in flight, messages waiting for their key, the oldest's age."""


@dataclass(frozen=True, slots=True)
class Settlement:
    """How a delivery is settled other than by a plain ack or nack."""

    reject: bool = False
    """Dead-letter it now (reason ``rejected``)."""
    release: bool = False
    """Give it back as it is, for prompt redelivery: not a failure (no limit, no delay)."""
    delay: float = 0.0
    """Retry: seconds before it is delivered again."""
    error: str | None = None
    """Text kept with it (``busmq-dead-error`` if it dies)."""


def due_ms(delay: float | None, at: datetime | None) -> str:
    """The push script's due argument: Unix ms, or '' for now."""
    if delay is not None and at is not None:
        raise ValueError("give delay or at, not both")
    if delay is not None:
        if delay < 0:
            raise ValueError("delay must not be negative")
        return f"+{int(delay * 1000)}" if delay > 0 else ""
    if at is not None:
        if at.tzinfo is None:
            raise ValueError("at must be an aware datetime (with a timezone)")
        return str(int(at.timestamp() * 1000))
    return ""


def expires_ms(ttl: float | None, expires_at: datetime | None) -> str:
    """The push script's expiry argument: Unix ms, or '' for never."""
    if ttl is not None and expires_at is not None:
        raise ValueError("give ttl or expires_at, not both")
    if ttl is not None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        return f"+{int(ttl * 1000)}"
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise ValueError("expires_at must be an aware datetime (with a timezone)")
        return str(int(expires_at.timestamp() * 1000))
    return ""


def error_text(error: str | BaseException | None) -> str:
    if error is None:
        return ""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return text[:MAX_ERROR_TEXT]


async def set_controls(queue: QueueStore, **fields: str | None) -> None:
    """Set (a str) or remove (None) control fields of the queue's info hash and wake its
    consumers, atomically and only if the queue exists (a plain HSET would create it)."""
    keys = queue.keys
    args: list[str] = [keys.notify_channel]
    for name, value in fields.items():
        args += (name, value or "")
    try:
        await queue.run(
            lambda c: queue.bus.scripts.call(c, "controls", [keys.info], args), idempotent=True
        )
    except RedisCommandError as exc:
        raise queue.script_error(exc) from None


async def read_info(queue: QueueStore) -> QueueInfo:
    await queue.send_deferred()
    keys = queue.keys
    dead = QueueKeys(dead_letter_name(queue.name))

    async def run(client: aioredis.Redis) -> list[object]:
        pipe = client.pipeline(transaction=False)
        pipe.hmget(
            keys.info, "seq", "mode", "paused", "rate", "krate", "maxdel", "expdrop", "order"
        )
        pipe.xlen(keys.stream)
        pipe.zcard(keys.due)
        pipe.xlen(dead.stream)
        pipe.xinfo_groups(keys.stream)
        pipe.pttl(keys.info)
        result: list[object] = await pipe.execute(raise_on_error=False)
        return result

    conf, count, delayed, dead_count, groups, pttl = await queue.run(run, idempotent=True)
    assert isinstance(conf, list)
    if conf[0] is None:
        raise QueueNotFoundError(queue.name)
    pending = 0
    if isinstance(groups, list):
        pending = sum(int(g.get("pending", 0)) for g in groups if isinstance(g, dict))
    mode = conf[1].decode() if isinstance(conf[1], bytes) else None
    ordering = conf[7].decode() if isinstance(conf[7], bytes) else None
    return QueueInfo(
        name=queue.name,
        count=_int(count),
        pending=pending,
        delayed=_int(delayed),
        dead_letters=_int(dead_count),
        last_id=int(conf[0]),
        ttl=max(_int(pttl), 0) / 1000,
        mode=mode,
        paused=conf[2] is not None,
        rate_limit=RateLimit.decode(conf[3]),
        key_rate_limit=RateLimit.decode(conf[4]),
        max_deliveries=int(conf[5]) if conf[5] is not None else None,
        drop_expired=conf[6] is not None,
        ordering=ordering,
        ordering_state=await read_state(queue) if ordering else None,
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


async def _requeue(client: aioredis.Redis, queue: QueueStore, args: list[str | int]) -> Any:
    return await queue.bus.scripts.call(client, "requeue", queue.keys.with_dead_letters(), args)


async def requeue_dead(queue: QueueStore, ids: list[int] | None, limit: int) -> list[int]:
    """Move dead letters back (see ``requeue.lua``). With a schema, only those that fit
    its current version go back; the others stay dead, with reason ``schema`` and the
    violation in ``busmq-dead-error`` (under a new dead-letter id, as a message that died
    again)."""
    for attempt in range(SCHEMA_ATTEMPTS):
        token = queue.bus.schemas.current.get(queue.name)
        listed = ids or []
        refused: list[tuple[int, str]] = []
        if token is not None:
            token, listed, refused = await fitting_dead_letters(queue, token, ids, limit)
            if not listed and not refused:
                return []
        args: list[str | int] = [limit, "" if token is None else token, len(refused)]
        for dead_id, why in refused:
            args += [dead_id, why[:MAX_ERROR_TEXT]]
        args += listed
        try:
            reply: list[int] = await queue.run(
                functools.partial(_requeue, queue=queue, args=args), idempotent=False
            )
        except RedisCommandError as exc:
            if attempt < SCHEMA_ATTEMPTS - 1 and learn_schema(queue, exc):
                continue
            raise queue.script_error(exc) from None
        return [int(i) for i in reply]
    raise AssertionError("unreachable")


async def settle(
    queue: QueueStore,
    consumer: str,
    ids: Sequence[int],
    settlement: Settlement,
    *,
    retry_policy: RetryPolicy | None = None,
    max_deliveries: int | None = None,
) -> list[int]:
    """Settle at-least-once deliveries of ``queue`` other than by ack (see
    :class:`Settlement`), as consumer ``consumer`` of its group: what a consumer's
    ``settle`` does, and what a process that does not hold the consumer (another
    gateway worker) can do by its name. Returns the ids that were not pending."""
    if settlement.release:
        op, delay = "release", "0"
    elif settlement.reject:
        op, delay = "reject", "0"
    elif settlement.delay > 0:
        op, delay = "retry", str(int(settlement.delay * 1000))
    elif retry_policy is not None:
        jitter = 1 - retry_policy.jitter * random.random()
        op = "retry"
        delay = (
            f"policy {int(retry_policy.initial * 1000)} {retry_policy.factor} "
            f"{int(retry_policy.max_delay * 1000)} {jitter}"
        )
    else:
        op, delay = "retry", "0"
    limit = "" if max_deliveries is None else str(max_deliveries)
    args: list[str | int] = [op, queue.name, consumer, delay, limit, settlement.error or "", *ids]
    attempts = 0

    async def run(client: aioredis.Redis) -> list[bytes]:
        nonlocal attempts
        attempts += 1
        keys = queue.keys.with_dead_letters()
        unknown: list[bytes] = await queue.bus.scripts.call(client, "settle", keys, args)
        return unknown

    # Safe to send again (through a failover): what the first attempt settled is no longer
    # pending, so a second one leaves it alone.
    unknown = await queue.run(run, idempotent=True)
    if attempts > 1:  # an attempt whose reply was lost may have settled them
        unknown = []
    if op != "reject":
        queue.read_in_full()  # what was parked here is due before what was stored after
    if op != "release":
        kind = "rejected" if op == "reject" else "retried"
        queue.bus.counters.add(kind, queue.name, len(ids) - len(unknown))
    return [int(u) for u in unknown]


async def ack_upto(queue: QueueStore, consumer: str, message_id: int) -> int:
    """Acknowledge every delivery pending for consumer ``consumer`` with an id up to
    ``message_id`` (what a consumer's ``ack_upto`` does, by its name); how many."""
    keys = queue.keys.ack_keys
    up_to = f"{message_id}-0"  # a stream id (message.int_to_stream_id; message imports us)
    acked: int = await queue.run_fast(
        lambda c: queue.bus.scripts.call(c, "ack_upto", keys, [consumer, up_to]),
        idempotent=True,
    )
    queue.bus.counters.add("acked", queue.name, acked)
    return acked


async def has_consumer(queue: QueueStore, consumer: str) -> bool:
    """Whether ``consumer`` is registered in ``queue``'s consumer group."""
    stream = queue.keys.stream

    async def read(client: aioredis.Redis) -> list[dict[str, object]]:
        try:
            found: list[dict[str, object]] = await client.xinfo_consumers(stream, CONSUMER_GROUP)
        except aioredis.ResponseError:  # no stream or no group yet
            return []
        return found

    names = {_text(c.get("name")) for c in await queue.run(read, idempotent=True)}
    return consumer in names


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
