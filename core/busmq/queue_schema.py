"""A queue's schema on its shard: the versions kept in the queue's info hash (see
``lua/schema.lua``), setting a version after the compatibility check, and checking a
push's payloads against the version this process believes current (the push script
confirms it; see :mod:`busmq.schemas`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

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
    token_version,
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
        None if current is None else token_version(_text(current)),
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
        mode_arg = "" if compatibility is None else str(compatibility)
        args = ["set", len(found), stored, mode_arg, created]
        try:
            version = int(await queue.script("schema", [queue.keys.info], args))
        except RedisCommandError as exc:
            if str(exc).startswith("CONFLICT"):
                continue  # another version was set meanwhile: check against it
            raise
        made = SchemaVersion(version, schema, created)
        queue.bus.schemas.current[queue.name] = made.token
        return made
    raise InvalidSchemaError(f"queue {queue.name!r}: schema versions kept changing; try again")


async def remove_schema(queue: QueueStore) -> None:
    """Stop enforcing a schema (the versions are kept: a later set is checked against
    the last one)."""
    await queue.script("schema", [queue.keys.info], ["remove"])
    queue.bus.schemas.current[queue.name] = None


async def compiled(queue: QueueStore, token: str) -> Compiled:
    """The validator of the version ``token`` names, compiled once per process. If the
    queue's version of that number is another (the queue was created again), that one:
    its own token says so, and the push script refuses it if it is not current."""
    cache = queue.bus.schemas
    found = cache.get(queue.name, token)
    if found is None:
        number = token_version(token)
        raw = await queue.run(lambda c: c.hget(queue.keys.info, f"sch:{number}"), idempotent=True)
        if raw is None:
            raise InvalidSchemaError(f"queue {queue.name!r} has no schema version {number}")
        stored = _version(number, raw)
        found = cache.get(queue.name, stored.token) or Compiled(number, stored.schema, stored.token)
        cache.put(queue.name, found)
    return found


async def latest_token(queue: QueueStore) -> str | None:
    """The token of the version the queue enforces now (``None``: none)."""
    raw = await queue.run(lambda c: c.hget(queue.keys.info, "schema"), idempotent=True)
    return None if raw is None else _text(raw)


async def check(
    queue: QueueStore,
    token: str | None,
    payloads: Sequence[bytes],
    values: Sequence[Any] | None = None,
) -> str:
    """The push script's schema argument for ``payloads`` (decoded: ``values``, see
    :meth:`Compiled.violations`) checked against the version ``token`` names (``''``: no
    schema); :class:`SchemaError` if any does not fit."""
    if token is None:
        return ""
    found = await compiled(queue, token)
    violations = found.violations(payloads, values)
    if not violations:
        return found.token
    # Refused against what this process believed: make sure that is still the version
    # (another process may have set a laxer one, or removed it) before saying so.
    latest = await latest_token(queue)
    queue.bus.schemas.current[queue.name] = latest
    if latest == found.token:
        raise SchemaError(queue.name, found.version, violations)
    return await check(queue, latest, payloads, values)


def refused_version(exc: RedisCommandError) -> str | Literal[False] | None:
    """The token of the queue's current version from a script's ``SCHEMA <token>``
    refusal (``None``: it has none), or ``False`` when ``exc`` is another error."""
    text = str(exc)
    if not text.startswith("SCHEMA"):
        return False
    return text.removeprefix("SCHEMA").strip() or None


def learn_schema(queue: QueueStore, exc: RedisCommandError) -> bool:
    """Whether ``exc`` is a script's refusal of messages checked against another schema
    version than the queue's (nothing was stored); if so, remember the queue's."""
    token = refused_version(exc)
    if token is False:
        return False
    queue.bus.schemas.current[queue.name] = token or None
    return True


async def fitting_dead_letters(
    queue: QueueStore, token: str, ids: Sequence[int] | None, limit: int
) -> tuple[str, list[int], list[tuple[int, str]]]:
    """Of the dead letters a requeue names (``ids``, or the oldest ``limit``, or all):
    the token of the version ``token`` names, the ids of those that fit it, and the ids
    of those that do not, each with why (they stay dead, for that reason)."""
    stream = QueueKeys(dead_letter_name(queue.name)).stream  # same hash tag, same shard

    async def listed(client: aioredis.Redis) -> list[Any]:
        if not ids:
            return list(await client.xrange(stream, "-", "+", count=limit or None) or [])
        found: list[Any] = []
        for message_id in ids:
            found += await client.xrange(stream, f"{message_id}-0", f"{message_id}-0") or []
        return found

    entries = await queue.run(listed, idempotent=True)
    validator = await compiled(queue, token)
    fitting: list[int] = []
    refused: list[tuple[int, str]] = []
    for entry_id, fields in entries:
        dead_id = int(entry_id.split(b"-")[0])
        violations = validator.violations([fields.get(b"p", b"")])
        if not violations:
            fitting.append(dead_id)
            continue
        first = violations[0]
        refused.append(
            (
                dead_id,
                f"schema version {validator.version}: at {first.pointer or '/'}: "
                f"{first.message} ({first.rule})",
            )
        )
    return validator.token, fitting, refused


def _version(number: int, raw: Any) -> SchemaVersion:
    stored = json.loads(raw)
    return SchemaVersion(number, from_stored(stored), int(stored["created_ms"]))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
