"""Everything the Spark data source does with Redis, without pyspark.

Options are parsed and checked here (in the driver, before any job runs); executors
then read and write with a sync ``redis.Redis`` client, which is what runs simplest
inside Spark's Python workers. Placement is busmq's: rendezvous hashing over the
shard list, probing in rank order for a queue that already exists (:mod:`busmq.placement`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from ..cluster import sync_cluster_client
from ..keys import QueueKeys, validate_name
from ..message import F_HEADERS, F_KIND, F_PAYLOAD, F_TIME, PayloadKind
from ..schemas import Compiled, SchemaError, from_stored, token_version
from ..scripts import script_source
from ..sentinel import sync_master_client
from ..settings import mask_url
from ..shard import shard_identity
from ..sharding import rank
from ..topology import (
    is_cluster_url,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
    split_urls,
    validate_redis_urls,
)

if TYPE_CHECKING:
    import redis

KIND_NAMES = {PayloadKind.BYTES.value: "bytes", PayloadKind.TEXT.value: "text", b"j": "json"}
DEFAULT_CHUNK = 100_000
READ_PAGE = 5_000
WRITE_BATCH = 500
DEFAULT_MAX_ROWS_PER_TRIGGER = 10_000
DEFAULT_DEDUPE_SECONDS = 600.0
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024


class OptionError(ValueError):
    """A bad option of the ``busmq`` data source."""


# -- options ---------------------------------------------------------------------------


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands options over case-insensitively (lower-cased keys in some paths).
    if name in options:
        return options[name]
    lowered = {k.lower(): v for k, v in options.items()}
    return lowered.get(name.lower())


def parse_urls(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = _get(options, "redis_urls")
    if not raw or not raw.strip():
        raise OptionError("option 'redis_urls' is required (comma-separated shard URLs)")
    urls = split_urls(raw)
    try:
        validate_redis_urls(urls)
    except ValueError as exc:
        raise OptionError(f"option 'redis_urls': {exc}") from None
    return urls


def parse_queues(options: Mapping[str, str], name: str = "queues") -> tuple[str, ...]:
    raw = _get(options, name)
    if not raw or not raw.strip():
        raise OptionError(f"option '{name}' is required")
    queues = tuple(q.strip() for q in raw.split(",") if q.strip())
    for queue in queues:
        try:
            validate_name(queue)
        except ValueError as exc:
            raise OptionError(f"option '{name}': {exc}") from None
    if len(set(queues)) != len(queues):
        raise OptionError(f"option '{name}' lists a queue twice")
    return queues


def parse_int(
    options: Mapping[str, str], name: str, default: int | None, minimum: int
) -> int | None:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option '{name}' must be >= {minimum}, got {value}")
    return value


def parse_float(options: Mapping[str, str], name: str, default: float) -> float:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(f"option '{name}' must be a number, got {raw!r}") from None
    if not value > 0:
        raise OptionError(f"option '{name}' must be positive, got {raw!r}")
    return value


def parse_bool(options: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise OptionError(f"option '{name}' must be true or false, got {raw!r}")


def parse_choice(options: Mapping[str, str], name: str, choices: Sequence[str]) -> str:
    raw = _get(options, name)
    value = (raw or choices[0]).strip().lower()
    if value not in choices:
        raise OptionError(f"option '{name}' must be one of {', '.join(choices)}, got {raw!r}")
    return value


# -- placement -------------------------------------------------------------------------


def client(url: str) -> redis.Redis:
    """A sync client of the shard ``url`` (of its current master, for a Sentinel URL)."""
    import redis

    if is_sentinel_url(url):
        return sync_master_client(parse_sentinel_url(url), connect_timeout=5.0, timeout=30.0)
    if is_cluster_url(url):
        cluster: redis.Redis = sync_cluster_client(
            parse_cluster_url(url), connect_timeout=5.0, timeout=30.0
        )
        return cluster
    return redis.Redis.from_url(url, socket_connect_timeout=5.0, socket_timeout=30.0)


def _ranked(urls: Sequence[str], name: str) -> list[str]:
    return [urls[i] for i in rank([shard_identity(u) for u in urls], name)]


def locate(urls: Sequence[str], name: str) -> tuple[str, bool]:
    """The shard URL holding queue ``name`` (or where it is to be created) and whether it
    exists: shards are probed in rendezvous order, the first holding it wins."""
    order = _ranked(urls, name)
    info = QueueKeys(name).info
    for url in order:
        try:
            with client(url) as c:
                if c.exists(info):
                    return url, True
        except Exception as exc:
            raise OptionError(f"cannot reach Redis shard {mask_url(url)}: {exc}") from None
    return order[0], False


def locate_existing(urls: Sequence[str], name: str) -> str:
    url, exists = locate(urls, name)
    if not exists:
        raise OptionError(f"unknown queue {name!r}: it does not exist on any shard (attach it)")
    return url


def last_id(url: str, name: str) -> int:
    with client(url) as c:
        return int(c.hget(QueueKeys(name).info, "seq") or 0)


def first_id(url: str, name: str) -> int | None:
    with client(url) as c:
        head = c.xrange(QueueKeys(name).stream, "-", "+", count=1)
    return int(head[0][0].split(b"-")[0]) if head else None


def dropped_through(url: str, name: str) -> int:
    """The highest id a replay reader of ``name`` can no longer read because the queue's
    retention (or a flush) dropped it: the ids below the stream's first entry, or every
    id issued when the stream is empty. 0 when nothing was dropped, and when it cannot
    be told: a queue consumed destructively (its consumers delete what they take) or one
    holding delayed messages (their ids are issued before they enter the stream)."""
    keys = QueueKeys(name)
    with client(url) as c:
        pipe = c.pipeline(transaction=False)
        pipe.hmget(keys.info, ["mode", "seq"])
        pipe.exists(keys.delayed)
        pipe.xrange(keys.stream, "-", "+", count=1)
        (mode, seq), delayed, head = pipe.execute()
    if mode == b"destructive" or delayed:
        return 0
    if head:
        return int(head[0][0].split(b"-")[0]) - 1
    return int(seq or 0)


class DataLossError(RuntimeError):
    """Messages a streaming query had not read yet were dropped by the queue's retention."""


# -- reading ---------------------------------------------------------------------------


class PageSource(Protocol):
    """Reads spans some other way than from Redis (a gateway, :mod:`._gateway`)."""

    def read_pages(self, span: Span) -> Iterator[Page]: ...


@dataclass(frozen=True)
class Span:
    """Ids ``low..high`` (inclusive) of one queue on one shard (or behind ``via``)."""

    url: str
    queue: str
    low: int
    high: int
    via: PageSource | None = None


def split(
    url: str, queue: str, low: int, high: int, chunk: int, via: PageSource | None = None
) -> list[Span]:
    return [
        Span(url, queue, lo, min(lo + chunk - 1, high), via) for lo in range(low, high + 1, chunk)
    ]


@dataclass
class Page:
    """Columns of up to ``READ_PAGE`` messages of one queue."""

    ids: list[int]
    payloads: list[bytes]
    kinds: list[str]
    headers: list[list[tuple[str, str]] | None]
    stamps: list[int]  # Unix ms
    json: list[str | None]


def read_pages(span: Span) -> Iterator[Page]:
    """The messages of ``span`` in id order, a page (one XRANGE) at a time."""
    if span.via is not None:
        yield from span.via.read_pages(span)
        return
    stream = QueueKeys(span.queue).stream
    low = span.low
    with client(span.url) as c:
        while low <= span.high:
            entries = c.xrange(stream, f"{low}-0", f"{span.high}-0", count=READ_PAGE)
            if not entries:
                return
            page = Page([], [], [], [], [], [])
            for entry_id, fields in entries:
                payload = fields.get(F_PAYLOAD, b"")
                kind = fields.get(F_KIND, b"b")
                raw_headers = fields.get(F_HEADERS)
                page.ids.append(int(entry_id[: entry_id.index(b"-")]))
                page.payloads.append(payload)
                page.kinds.append(KIND_NAMES.get(kind) or kind.decode())
                page.headers.append(list(json.loads(raw_headers).items()) if raw_headers else [])
                page.stamps.append(int(fields.get(F_TIME, b"0")))
                page.json.append(payload.decode("utf-8") if kind == b"j" else None)
            yield page
            if len(entries) < READ_PAGE:
                return
            low = page.ids[-1] + 1


# -- offsets ---------------------------------------------------------------------------


def parse_offset(raw: str | Mapping[str, Any], queues: Sequence[str]) -> dict[str, int]:
    """A stream offset ``{queue: last id}``, checked against the queues read."""
    try:
        value = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except ValueError:
        raise OptionError(f"bad busmq offset {raw!r}: not JSON") from None
    if not isinstance(value, dict):
        raise OptionError(f"bad busmq offset {raw!r}: not a JSON object")
    offset: dict[str, int] = {}
    for queue in queues:
        position = value.get(queue, 0)
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise OptionError(f"bad busmq offset {raw!r}: {queue!r} needs a non-negative integer")
        offset[queue] = position
    return offset


def bounded_end(start: Mapping[str, int], latest: Mapping[str, int], budget: int) -> dict[str, int]:
    """The end offset of the next micro-batch: at most ``budget`` new ids in all, shared
    fairly between queues (round robin), never moving any queue backwards."""
    end = {q: max(start.get(q, 0), latest.get(q, 0)) for q in latest}
    backlog = {q: end[q] - start.get(q, 0) for q in end}
    if sum(backlog.values()) <= budget:
        return end
    grant = dict.fromkeys(end, 0)
    left = budget
    pending = [q for q in end if backlog[q] > 0]
    while left > 0 and pending:
        share = max(left // len(pending), 1)
        for q in list(pending):
            take = min(share, backlog[q] - grant[q], left)
            grant[q] += take
            left -= take
            if grant[q] >= backlog[q]:
                pending.remove(q)
            if left == 0:
                break
    return {q: start.get(q, 0) + grant[q] for q in end}


# -- writing ---------------------------------------------------------------------------


@cache
def push_script() -> str:
    """The core's push script, run unchanged by the writers."""
    return script_source("push")


@cache
def attach_script() -> str:
    return script_source("attach")


def attach(
    url: str, name: str, member: str, lease_seconds: float, ttl_seconds: float, create: bool
) -> bool:
    """Attach (or renew) ``member``'s lease on queue ``name``; returns whether it exists."""
    keys = QueueKeys(name)
    with client(url) as c:
        all_keys = keys.with_dead_letters()
        reply = c.eval(
            attach_script(),
            len(all_keys),
            *all_keys,
            member,
            int(lease_seconds * 1000),
            int(ttl_seconds * 1000),
            "1" if create else "0",
            "",
            "",
            "",
        )
    return int(reply[0]) >= 0


@dataclass
class PushOutcome:
    pushed: int = 0
    duplicates: int = 0
    first_id: int | None = None
    last_id: int | None = None


def push(
    c: redis.Redis,
    name: str,
    flat: list[bytes | str],
    request_id: str,
    dedupe_seconds: float,
    producer: tuple[str, int] | None = None,
) -> tuple[int, bool]:
    """EVAL the core's push script: ``flat`` holds (payload, kind, headers) triples.
    With ``producer`` ((name, sequence), epoch 0) the push is deduplicated by the
    producer's sequence, with no time window, instead of by ``request_id``. Returns
    (first id, duplicate)."""
    keys = QueueKeys(name)
    import redis as redis_module

    script_keys = [keys.info, keys.stream, keys.due, keys.delayed]
    if producer is None:
        script_keys.append(keys.dedupe_prefix + request_id)
        sequenced = ""
    else:
        sequenced = f"0 {producer[1]} {producer[0]}"
    version = c.hget(keys.info, "schema")
    try:
        for _ in range(3):
            try:
                reply = c.eval(
                    push_script(),
                    len(script_keys),
                    *script_keys,
                    int(dedupe_seconds * 1000),
                    keys.notify_channel,
                    "",  # due now
                    "",  # never expires
                    3,  # (payload, kind, headers) per message
                    sequenced,
                    _checked(c, name, version, flat),
                    *flat,
                )
                break
            except redis_module.ResponseError as exc:
                if not str(exc).startswith("SCHEMA"):
                    raise
                version = str(exc).removeprefix("SCHEMA").strip() or None  # changed: again
        else:
            raise RuntimeError(f"busmq queue {name!r}: its schema kept changing")
    except redis_module.ResponseError as exc:
        text = str(exc)
        if "NOQUEUE" in text:
            raise RuntimeError(f"busmq queue {name!r} does not exist (attach it first)") from None
        if text.startswith("FULL"):
            raise RuntimeError(f"busmq queue {name!r} is full ({text})") from None
        raise
    return int(reply[0]), bool(reply[1])


_compiled: dict[tuple[str, str], Compiled] = {}


def _checked(c: redis.Redis, name: str, version: Any, flat: list[bytes | str]) -> str:
    """The push script's schema argument: ``flat``'s payloads checked against the
    queue's schema ``version`` (``''``: none); a ``SchemaError`` names the first rows of
    the batch that do not fit."""
    if version is None:
        return ""
    token = version.decode() if isinstance(version, bytes) else str(version)
    compiled = _compiled.get((name, token))
    if compiled is None:
        number = token_version(token)
        stored = json.loads(c.hget(QueueKeys(name).info, f"sch:{number}") or "{}")
        compiled = Compiled(number, from_stored(stored), token)
        _compiled[(name, token)] = compiled
    payloads = [p if isinstance(p, bytes) else p.encode() for p in flat[::3]]
    violations = compiled.violations(payloads)
    if violations:
        raise SchemaError(name, compiled.version, violations)
    return token


def encode_row(
    payload: Any, headers: Mapping[str, str] | None, kind: str, limit: int
) -> tuple[bytes, bytes, bytes]:
    """(payload, kind, headers) as push.lua stores them, checked like the core does."""
    if payload is None:
        raise ValueError("busmq writer: a row has a null payload")
    if isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
        code = PayloadKind.BYTES.value
    elif isinstance(payload, str):
        data = payload.encode("utf-8")
        code = PayloadKind.TEXT.value
    else:
        raise ValueError(f"busmq writer: payload must be binary or string, got {type(payload)}")
    if kind == "json":
        try:
            json.loads(data)
        except ValueError:
            raise ValueError(f"busmq writer: payload is not JSON: {data[:80]!r}") from None
        code = PayloadKind.JSON.value
    elif kind == "text":
        code = PayloadKind.TEXT.value
    elif kind == "bytes":
        code = PayloadKind.BYTES.value
    encoded_headers = b""
    if headers:
        for key, val in headers.items():
            if not isinstance(key, str) or not key or not isinstance(val, str):
                raise ValueError(f"busmq writer: headers must map non-empty str to str: {key!r}")
        encoded_headers = json.dumps(dict(headers), separators=(",", ":")).encode()
    if len(data) + len(encoded_headers) > limit:
        raise ValueError(
            f"busmq writer: message of {len(data) + len(encoded_headers)} bytes exceeds {limit}"
        )
    return data, code, encoded_headers
