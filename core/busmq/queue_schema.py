"""A queue's schema on its shard: the versions kept in the queue's info hash (see
``lua/schema.lua``), setting a version after the compatibility check, and checking a
push's payloads against the version this process believes current (the push script
confirms it; see :mod:`busmq.schemas`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from .errors import RedisCommandError
from .keys import QueueKeys, dead_letter_name
from .protobuf_schema import ProtobufSchema
from .schema_compat import incompatibilities
from .schemas import (
    Compatibility,
    Compiled,
    InvalidSchemaError,
    JsonSchema,
    Schema,
    SchemaCompatibilityError,
    SchemaError,
    SchemaVersion,
    from_stored,
    to_stored,
)

if TYPE_CHECKING:
    from .queue_store import QueueStore

MAX_VERSIONS = 1000
"""A queue keeps at most this many schema versions."""

_CONFLICT_ATTEMPTS = 5

SCHEMA_ATTEMPTS = 3
"""Pushes of one batch when the queue's schema version changes under it."""


async def versions(queue: QueueStore) -> tuple[int | None, Compatibility, list[SchemaVersion]]:
    """The current version (``None``: no schema is enforced), the compatibility mode and
    every version, oldest first."""
    current, count, mode = await queue.run(
        lambda c: c.hmget(queue.keys.info, "schema", "schemas", "schemac"), idempotent=True
    )
    n = int(count or 0)
    found: list[SchemaVersion] = []
    if n:
        fields = [f"sch:{v}" for v in range(1, n + 1)]
        stored = await queue.run(lambda c: c.hmget(queue.keys.info, fields), idempotent=True)
        found = [_version(v, raw) for v, raw in enumerate(stored, start=1) if raw is not None]
    return (
        None if current is None else int(current),
        Compatibility(_text(mode)) if mode else Compatibility.BACKWARD,
        found,
    )


async def current(queue: QueueStore) -> SchemaVersion | None:
    """The version enforced now, or ``None``."""
    number, _, found = await versions(queue)
    return next((v for v in found if v.version == number), None)


async def set_schema(
    queue: QueueStore, schema: Schema, compatibility: Compatibility | None
) -> SchemaVersion:
    """Add ``schema`` as the queue's next version (or return the current one if it is
    the same schema), after checking it against the earlier ones under the queue's mode
    (or ``compatibility``, which becomes the queue's mode)."""
    if not isinstance(schema, JsonSchema | ProtobufSchema):
        raise InvalidSchemaError(
            f"a schema is a JsonSchema or a ProtobufSchema, not {type(schema).__name__}"
        )
    for _ in range(_CONFLICT_ATTEMPTS):
        number, mode, found = await versions(queue)
        mode = compatibility or mode
        latest = found[-1] if found else None
        if latest is not None and latest.schema == schema and number == latest.version:
            if compatibility is not None:
                await queue.script("schema", [queue.keys.info], ["mode", str(compatibility)])
            return latest
        if len(found) >= MAX_VERSIONS:
            raise InvalidSchemaError(f"queue {queue.name!r} has {MAX_VERSIONS} schema versions")
        broken = incompatibilities(mode, schema, found)
        if broken:
            against, breaks = broken[0]
            raise SchemaCompatibilityError(queue.name, mode, against, breaks)
        created = int(time.time() * 1000)
        stored = json.dumps({**to_stored(schema), "created_ms": created}, sort_keys=True)
        args = ["set", len(found), stored, "" if compatibility is None else str(compatibility)]
        try:
            version = int(await queue.script("schema", [queue.keys.info], args))
        except RedisCommandError as exc:
            if str(exc).startswith("CONFLICT"):
                continue  # another version was set meanwhile: check against it
            raise
        queue.bus.schemas.current[queue.name] = version
        return SchemaVersion(version, schema, created)
    raise InvalidSchemaError(f"queue {queue.name!r}: schema versions kept changing; try again")


async def remove_schema(queue: QueueStore) -> None:
    """Stop enforcing a schema (the versions are kept: a later set is checked against
    the last one)."""
    await queue.script("schema", [queue.keys.info], ["remove"])
    queue.bus.schemas.current[queue.name] = None


async def compiled(queue: QueueStore, version: int) -> Compiled:
    """Version ``version``'s validator, compiled once per process."""
    cache = queue.bus.schemas
    found = cache.get(queue.name, version)
    if found is None:
        raw = await queue.run(lambda c: c.hget(queue.keys.info, f"sch:{version}"), idempotent=True)
        if raw is None:
            raise InvalidSchemaError(f"queue {queue.name!r} has no schema version {version}")
        found = Compiled(version, _version(version, raw).schema)
        cache.put(queue.name, found)
    return found


async def check(
    queue: QueueStore,
    version: int | None,
    payloads: Sequence[bytes],
    values: Sequence[Any] | None = None,
) -> str:
    """The push script's schema argument for ``payloads`` (decoded: ``values``, see
    :meth:`Compiled.violations`) checked against ``version`` (``''``: no schema);
    :class:`SchemaError` if any does not fit."""
    if version is None:
        return ""
    violations = (await compiled(queue, version)).violations(payloads, values)
    if not violations:
        return str(version)
    # Refused against what this process believed: make sure that is still the version
    # (another process may have set a laxer one, or removed it) before saying so.
    raw = await queue.run(lambda c: c.hget(queue.keys.info, "schema"), idempotent=True)
    latest = None if raw is None else int(raw)
    queue.bus.schemas.current[queue.name] = latest
    if latest == version:
        raise SchemaError(queue.name, version, violations)
    return await check(queue, latest, payloads, values)


def refused_version(exc: RedisCommandError) -> int | bool | None:
    """The queue's current version from a push script's ``SCHEMA <n>`` refusal (``None``:
    it has none), or ``False`` when ``exc`` is another error."""
    text = str(exc)
    if not text.startswith("SCHEMA"):
        return False
    rest = text.removeprefix("SCHEMA").strip()
    return int(rest) if rest else None


def learn_schema(queue: QueueStore, exc: RedisCommandError) -> bool:
    """Whether ``exc`` is a script's refusal of messages checked against another schema
    version than the queue's (nothing was stored); if so, remember the queue's."""
    version = refused_version(exc)
    if version is False:
        return False
    queue.bus.schemas.current[queue.name] = version or None
    return True


async def fitting_dead_letters(
    queue: QueueStore, version: int, ids: Sequence[int] | None, limit: int
) -> list[int]:
    """Of the dead letters a requeue names (``ids``, or the oldest ``limit``, or all), the
    ids of those that fit schema ``version``; the others stay dead."""
    stream = QueueKeys(dead_letter_name(queue.name)).stream  # same hash tag, same shard

    async def listed(client: aioredis.Redis) -> list[Any]:
        if not ids:
            return list(await client.xrange(stream, "-", "+", count=limit or None) or [])
        found: list[Any] = []
        for message_id in ids:
            found += await client.xrange(stream, f"{message_id}-0", f"{message_id}-0") or []
        return found

    entries = await queue.run(listed, idempotent=True)
    validator = await compiled(queue, version)
    return [
        int(entry_id.split(b"-")[0])
        for entry_id, fields in entries
        if not validator.violations([fields.get(b"p", b"")])
    ]


def _version(number: int, raw: Any) -> SchemaVersion:
    stored = json.loads(raw)
    return SchemaVersion(number, from_stored(stored), int(stored["created_ms"]))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
