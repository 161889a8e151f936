"""Schemas per queue: what a queue's messages must look like, with versions and a
compatibility mode, enforced on push.

A queue's schema is a JSON Schema (draft 2020-12) that every message's payload, read as
JSON, must satisfy, or a protobuf message type its payload must parse as
(:mod:`busmq.protobuf_schema`). :meth:`busmq.Queue.set_schema` adds a version, checked against the
last one under the queue's :class:`Compatibility` (see :mod:`busmq.schema_compat`); the
versions are kept with the queue, in its info hash, for as long as it lives.

Enforcement is split so that it costs Redis nothing and holds across processes: the
pushing process validates each message against the version it believes current, and
the push script stores the batch only if that version is still the queue's current one
(one more field in a read the script already makes). Otherwise the script refuses with
the current version, and the process loads it, validates again and retries. A queue
without a schema is pushed to with the belief "none", which the script confirms; nothing
is validated. Compiled validators are cached per process by (queue, version): a version
never changes once written, so the cache needs no invalidation, only a bound.

Each stored message carries the version it was checked against (stream field ``sv``),
shown as ``delivery.message.schema_version``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jsonschema_rs
import orjson

from .errors import InvalidMessageError, InvalidSchemaError
from .protobuf_schema import CompiledProtobuf, ProtobufSchema

__all__ = [
    "Compatibility",
    "InvalidSchemaError",
    "JsonSchema",
    "ProtobufSchema",
    "Schema",
    "SchemaCompatibilityError",
    "SchemaError",
    "SchemaVersion",
    "Violation",
]

MAX_SCHEMA_BYTES = 256 * 1024
"""The largest schema document, as JSON (it is stored in the queue's info hash)."""

MAX_VIOLATIONS = 20
"""At most this many violations are reported per refused push."""


class Compatibility(StrEnum):
    """How a new version must relate to the earlier ones (Confluent's modes).

    BACKWARD: consumers on the new version can read what was pushed under the last one.
    FORWARD: consumers on the last version can read what is pushed under the new one.
    FULL: both. The ``_TRANSITIVE`` forms check against every earlier version, not only
    the last. NONE: no check."""

    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def transitive(self) -> bool:
        return self.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return self.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        return self.startswith(("FORWARD", "FULL"))


@dataclass(frozen=True)
class JsonSchema:
    """A JSON Schema (draft 2020-12) for JSON payloads."""

    document: Mapping[str, Any] | bool

    def __post_init__(self) -> None:
        try:
            text = json.dumps(self.document, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise InvalidSchemaError(f"a JSON Schema must be JSON: {exc}") from None
        if len(text) > MAX_SCHEMA_BYTES:
            raise InvalidSchemaError(
                f"a schema is at most {MAX_SCHEMA_BYTES} bytes as JSON, this one {len(text)}"
            )
        document = self.plain()
        try:
            jsonschema_rs.meta.validate(document)
        except jsonschema_rs.ValidationError as error:
            where = "".join(f"/{_escape(p)}" for p in error.instance_path) or "/"
            raise InvalidSchemaError(
                f"not a valid JSON Schema at {where}: {error.message}"
            ) from None
        try:
            jsonschema_rs.validator_for(document)
        except (jsonschema_rs.ValidationError, ValueError) as exc:
            raise InvalidSchemaError(f"the schema does not compile: {exc}") from None

    def plain(self) -> dict[str, Any] | bool:
        """The document as plain JSON values (what the validator takes)."""
        return self.document if isinstance(self.document, bool) else dict(self.document)

    @property
    def kind(self) -> str:
        return "json"

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "document": self.document}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JsonSchema:
        stored = json.loads(text)
        return cls(stored["document"])


Schema = JsonSchema | ProtobufSchema
"""What a queue's schema can be: a JSON Schema, or a protobuf message type."""


def to_stored(schema: Schema) -> dict[str, Any]:
    """``schema`` as the JSON object a version is stored as (without its time)."""
    if isinstance(schema, ProtobufSchema):
        return schema.to_stored()
    return {"kind": schema.kind, "document": schema.document}


def describe(schema: Schema) -> Any:
    """What shows a schema to a person: the JSON Schema document, or the protobuf
    message type's name and whether unknown fields are accepted."""
    if isinstance(schema, ProtobufSchema):
        return {"protobuf": schema.message, "allow_unknown": schema.allow_unknown}
    return schema.document


def from_stored(stored: dict[str, Any]) -> Schema:
    if stored.get("kind") == "protobuf":
        return ProtobufSchema.from_stored(stored)
    return JsonSchema(stored["document"])


@dataclass(frozen=True)
class SchemaVersion:
    """One version of a queue's schema: its number (1, 2, ...), the schema and when it
    was set (Unix ms)."""

    version: int
    schema: Schema
    created_ms: int

    @property
    def token(self) -> str:
        """What names this version of this queue for the push script (see
        :class:`ValidatorCache`)."""
        return version_token(self.version, self.created_ms)


def version_token(version: int, created_ms: int) -> str:
    return f"{version}:{created_ms}"


def token_version(token: str) -> int:
    """The version number of a token."""
    return int(token.split(":", 1)[0])


@dataclass(frozen=True)
class Violation:
    """Why one message of a push was refused: its index in the batch, the JSON pointer
    to the offending value, the rule (JSON Schema keyword) broken and a message."""

    index: int
    pointer: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"message {self.index} at {self.pointer or '/'}: {self.message} ({self.rule})"


class SchemaError(InvalidMessageError):
    """A push was refused because messages do not fit the queue's schema: nothing of the
    batch was stored. ``violations`` says which message, where, and which rule."""

    def __init__(self, queue: str, version: int, violations: Sequence[Violation]) -> None:
        shown = "; ".join(str(v) for v in violations[:3])
        more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
        super().__init__(f"queue {queue!r} schema version {version}: {shown}{more}")
        self.queue = queue
        self.version = version
        self.violations = list(violations)


class SchemaCompatibilityError(InvalidMessageError):
    """A new schema version breaks the queue's compatibility mode; ``breaks`` names each
    change that does. The queue keeps its current version."""

    def __init__(self, queue: str, mode: Compatibility, against: int, breaks: Sequence[str]):
        super().__init__(
            f"queue {queue!r}: the new schema is not {mode} compatible with version "
            f"{against}: {'; '.join(breaks)}"
        )
        self.queue = queue
        self.mode = mode
        self.against = against
        self.breaks = list(breaks)


UNPARSED: Any = object()
"""In a push's decoded values: this message's payload is to be parsed as JSON."""


class Compiled:
    """A version's validator, compiled once per process."""

    __slots__ = ("protobuf", "token", "validator", "version")

    def __init__(self, version: int, schema: Schema, token: str = "") -> None:
        self.version = version
        self.token = token or str(version)
        self.protobuf: CompiledProtobuf | None = None
        self.validator: Any = None
        if isinstance(schema, ProtobufSchema):
            self.protobuf = CompiledProtobuf(schema)
        else:
            self.validator = jsonschema_rs.validator_for(schema.plain())

    def violations(
        self, payloads: Sequence[bytes], values: Sequence[Any] | None = None
    ) -> list[Violation]:
        """Every message of ``payloads`` that is not JSON or does not fit (bounded).
        ``values``, when given, holds each message's value already decoded (the JSON
        value it was pushed as), or :data:`UNPARSED` where the payload is to be parsed:
        parsing is most of the cost (measured 8.7 us of 10.2 for a 10-field order)."""
        found: list[Violation] = []
        if self.protobuf is not None:
            for index, payload in enumerate(payloads):
                problem = self.protobuf.problem(payload)
                if problem is not None:
                    found.append(Violation(index, "", *problem))
                    if len(found) >= MAX_VIOLATIONS:
                        break
            return found
        validator = self.validator
        for index, payload in enumerate(payloads):
            instance = UNPARSED if values is None else values[index]
            if instance is UNPARSED:
                try:
                    instance = _parse(payload)
                except ValueError as exc:
                    found.append(Violation(index, "", "json", f"not JSON: {exc}"))
                    continue
            if validator.is_valid(instance):
                continue
            for error in validator.iter_errors(instance):
                pointer = "".join(f"/{_escape(p)}" for p in error.instance_path)
                rule = str(error.schema_path[-1]) if error.schema_path else "schema"
                found.append(Violation(index, pointer, rule, error.message))
                if len(found) >= MAX_VIOLATIONS:
                    return found
        return found


def _parse(payload: bytes) -> Any:
    """A payload's JSON value: orjson (1.3 us for a 10-field order against json's 5.7,
    measured in one run; parsing was most of a check's cost), and json's reading where
    orjson refuses what json (and so a consumer's ``delivery.data``) reads: NaN,
    Infinity, lone surrogates. orjson reads an integer beyond 64 bits as a double."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)


def _escape(part: str | int) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


class ValidatorCache:
    """Compiled validators by (queue, version token), least recently used dropped first,
    and each queue's version token as this process last learned it from Redis
    (``None``: no schema). Redis stays the authority: a push checked against a stale
    belief is refused by the script and retried (see the module's docstring).

    A token is ``<version>:<created ms>``, not the version alone: a queue closed and
    created again numbers its versions from 1 again, and another process's version 1
    of the old queue must not pass for the new one's."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._compiled: OrderedDict[tuple[str, str], Compiled] = OrderedDict()
        self.current: dict[str, str | None] = {}

    def get(self, queue: str, token: str) -> Compiled | None:
        compiled = self._compiled.get((queue, token))
        if compiled is not None:
            self._compiled.move_to_end((queue, token))
        return compiled

    def put(self, queue: str, compiled: Compiled) -> None:
        self._compiled[(queue, compiled.token)] = compiled
        self._compiled.move_to_end((queue, compiled.token))
        while len(self._compiled) > self._size:
            self._compiled.popitem(last=False)

    def forget(self, queue: str) -> None:
        """Drop what is known of ``queue`` (it was closed, or its schema removed)."""
        self.current.pop(queue, None)
        for key in [k for k in self._compiled if k[0] == queue]:
            del self._compiled[key]
