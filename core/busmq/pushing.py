"""Storing messages in a queue: flattening a batch into the push script's arguments, the
script (or its durable variant), request ids and the errors a push can end with."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .controls import due_ms, expires_ms
from .durability import Durability
from .errors import (
    BusUnavailableError,
    DurabilityError,
    MessageTooLargeError,
    ProducerFencedError,
    RedisCommandError,
)
from .keys import validate_name
from .message import EncodedMessage, Payload, PayloadKind, encode_item
from .queue_schema import SCHEMA_ATTEMPTS, check, learn_schema
from .schemas import UNPARSED

if TYPE_CHECKING:
    from .queue_store import QueueStore
    from .shard import Shard

Headers = Mapping[str, str]
Item = Payload | tuple[Payload, Headers | None] | EncodedMessage
Flat = list[bytes | str | int]

_BYTES_KIND = PayloadKind.BYTES.value


MAX_SEQUENCE = 2**53 - 1
"""The largest producer sequence or epoch (Redis's Lua numbers are doubles)."""


@dataclass(frozen=True, slots=True)
class Producer:
    """A producer of sequenced pushes: its name and epoch. Obtain one with
    :meth:`busmq.Bus.producer`, which gives every new instance of a name a higher epoch,
    so that an older instance still running (a zombie) is refused; or pass the name
    alone to ``push(producer=...)`` (epoch 0, never fenced)."""

    name: str
    epoch: int = 0

    def __post_init__(self) -> None:
        validate_name(self.name)
        if not 0 <= self.epoch <= MAX_SEQUENCE:
            raise ValueError(f"a producer epoch is 0 to {MAX_SEQUENCE}, got {self.epoch!r}")


@dataclass(frozen=True, slots=True)
class Sequenced:
    """A push numbered by its producer: stored once per (queue, producer, sequence),
    with no time window (see :meth:`QueueAPI.push`)."""

    producer: Producer
    sequence: int

    @classmethod
    def of(cls, producer: str | Producer | None, sequence: int | None) -> Sequenced | None:
        """The numbering of a push from the ``producer`` and ``sequence`` arguments."""
        if producer is None and sequence is None:
            return None
        if producer is None or sequence is None:
            raise ValueError("producer and sequence go together")
        if type(sequence) is not int or not 0 <= sequence <= MAX_SEQUENCE:
            raise ValueError(f"a sequence is an int from 0 to {MAX_SEQUENCE}, got {sequence!r}")
        return cls(Producer(producer) if isinstance(producer, str) else producer, sequence)

    @property
    def script_arg(self) -> str:
        return f"{self.producer.epoch} {self.sequence} {self.producer.name}"


@dataclass(slots=True)
class PushOptions:
    """How a push is stored (see :meth:`QueueAPI.push`)."""

    request_id: str | None = None
    durability: Durability | str | None = None
    delay: float | None = None
    at: datetime | None = None
    ttl: float | None = None
    expires_at: datetime | None = None
    sequenced: Sequenced | None = None


@dataclass(frozen=True)
class PushResult:
    """Ids of the pushed messages; ``duplicate`` if the ``request_id`` or the producer's
    sequence was already stored: nothing was written and ``ids`` are those of the
    original push, or empty for a producer's sequence older than its last push (only
    the last push's ids are kept)."""

    ids: list[int]
    duplicate: bool


def flatten(items: Iterable[Item], limit: int) -> tuple[Flat, int]:
    """The push script's per-message arguments for ``items``, checked against ``limit``
    bytes, and how many messages there are: the payloads alone while every item is plain
    bytes (a third of the arguments to pack and for Redis to parse), (payload, kind,
    headers) triples from the first item that is not."""
    flat: Flat = []
    rest = iter(items)
    for item in rest:
        if type(item) is not bytes:
            flat = _triples(flat)
            message = encode_item(item, limit)
            flat += (message.payload, message.kind.value, message.headers)
            break
        if len(item) > limit:
            raise MessageTooLargeError(len(item), limit)
        flat.append(item)
    else:
        return flat, len(flat)
    for item in rest:
        if type(item) is bytes:
            if len(item) > limit:
                raise MessageTooLargeError(len(item), limit)
            flat += (item, _BYTES_KIND, b"")
        else:
            message = encode_item(item, limit)
            flat += (message.payload, message.kind.value, message.headers)
    return flat, len(flat) // 3


def flatten_encoded(encoded: Sequence[EncodedMessage]) -> Flat:
    """Like :func:`flatten`, for messages already encoded (and checked)."""
    plain: Flat = []
    for message in encoded:
        if message.headers or message.kind is not PayloadKind.BYTES:
            break
        plain.append(message.payload)
    else:
        return plain
    flat: Flat = []
    for message in encoded:
        flat += (message.payload, message.kind.value, message.headers)
    return flat


async def schema_arg(
    queue: QueueStore, flat: Flat, count: int, values: Sequence[Any] | None = None
) -> str:
    """The push script's schema argument for ``count`` flattened messages (``values``:
    their decoded values, see :func:`decoded_values`): checked against the version this
    process believes ``queue`` has (``''``: none)."""
    believed = queue.bus.schemas.current.get(queue.name)
    if believed is None:
        return ""
    stride = 1 if len(flat) == count else 3
    return await check(queue, believed, payloads(flat, stride), values)


def decoded_values(items: Sequence[Item]) -> list[Any]:
    """Each item's value where it is pushed as JSON (a dict, list, number, bool or
    ``None``), else :data:`~busmq.schemas.UNPARSED`: a schema check then skips parsing
    what it was handed decoded."""
    values: list[Any] = []
    for item in items:
        value = item[0] if type(item) is tuple else item
        values.append(
            UNPARSED
            if isinstance(value, bytes | bytearray | memoryview | str | EncodedMessage)
            else value
        )
    return values


def payloads(flat: Flat, stride: int) -> list[bytes]:
    """The payloads of a push's flattened messages (see :func:`flatten`)."""
    return [p if isinstance(p, bytes) else str(p).encode() for p in flat[::stride]]


def _triples(payloads: Flat) -> Flat:
    flat: Flat = []
    for payload in payloads:
        flat += (payload, _BYTES_KIND, b"")
    return flat


async def store(
    queue: QueueStore,
    flat: Flat,
    count: int,
    options: PushOptions,
    values: Sequence[Any] | None = None,
) -> PushResult:
    """Run the push script for ``count`` flattened messages on ``queue`` (``values``:
    their decoded values, if known, for a schema check)."""
    queue.require_open()
    if not count:
        return PushResult([], False)
    request_id, durability = options.request_id, options.durability
    bus, keys = queue.bus, queue.keys
    args: Flat = [
        int(bus.settings.dedupe_seconds * 1000),
        keys.notify_channel,
        due_ms(options.delay, options.at),
        expires_ms(options.ttl, options.expires_at),
        1 if len(flat) == count else 3,  # payloads alone, or (payload, kind, headers)
        "" if options.sequenced is None else options.sequenced.script_arg,
        await schema_arg(queue, flat, count, values),
        *flat,
    ]
    script_keys = [keys.info, keys.stream, keys.due, keys.delayed]
    if request_id is not None:
        if not request_id or len(request_id) > 200:
            raise ValueError("request_id must be 1-200 characters")
        script_keys.append(keys.dedupe_prefix + request_id)
    level = bus.settings.durability if durability is None else Durability.parse(durability)
    try:
        reply, shortfall, shard = await _run(queue, script_keys, args, level, flat, values)
    except RedisCommandError as exc:
        sequenced = options.sequenced
        if sequenced is not None and str(exc).startswith("FENCED"):
            producer = sequenced.producer
            current = int(str(exc).split()[1])
            raise ProducerFencedError(queue.name, producer.name, producer.epoch, current) from None
        raise queue.script_error(exc) from None
    except BusUnavailableError as exc:  # may be stored: the id to retry with
        exc.request_id = request_id
        raise
    first, duplicate = int(reply[0]), bool(reply[1])
    if len(reply) > 2:  # a producer's duplicate: the ids of its last push, if it was that
        count = int(reply[2])
    if not duplicate:
        bus.counters.add("pushed", queue.name, count)
    ids = list(range(first, first + count))
    if shortfall is not None:
        raise DurabilityError(
            f"push to {queue.name!r} applied but not confirmed {level}: {shortfall}; "
            "it may be stored: retry with the same request_id",
            shard.label if shard is not None else "",
            ids,
        )
    return PushResult(ids, duplicate)


def _nudged(queue: QueueStore, push: Awaitable[Any]) -> Awaitable[Any]:
    """``push`` (about to go out on the shard's hot-path connection), with one of this
    process's idle consumers of the queue woken first: its read follows the push on the
    same connection, so Redis runs it after the push (see ``Notifier.nudge``)."""
    if queue.shard is not None:
        queue.shard.notifier.nudge(queue.keys.notify_channel_bytes)
    return push


async def _run(
    queue: QueueStore,
    keys: list[str],
    args: Flat,
    level: Durability,
    flat: Flat,
    values: Sequence[Any] | None,
) -> tuple[Any, str | None, Shard | None]:
    """The push script's reply, the durability shortfall (if any) and the shard asked
    for it. A refusal for a schema version that changed meanwhile stored nothing: the
    messages are checked against the queue's version and sent again."""
    bus = queue.bus
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            if level.is_async:
                reply = await queue.run_fast(
                    lambda c: _nudged(queue, bus.scripts.call(c, "push", keys, args)),
                    idempotent=False,
                )
                return reply, None, None
            shard = await queue.located()
            sha, source = bus.scripts.source("push")
            reply, shortfall = await shard.run_durable(
                sha, source, keys, args, level, route=queue.keys.stream
            )
            return reply, shortfall, shard
        except RedisCommandError as exc:
            if attempt == SCHEMA_ATTEMPTS - 1 or not learn_schema(queue, exc):
                raise
            count = len(flat) if args[4] == 1 else len(flat) // 3
            args[6] = await schema_arg(queue, flat, count, values)
    raise AssertionError("unreachable")
