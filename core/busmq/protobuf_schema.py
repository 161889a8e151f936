"""A queue schema for binary payloads: a protobuf message type, given as a serialized
``FileDescriptorSet`` (``protoc --include_imports --descriptor_set_out``, ``buf build -o``)
and the message's full name. A payload must parse as that type; unknown fields are
refused unless ``allow_unknown``. See :mod:`busmq.schemas`.

Compatibility is read field by field, by number, the way the wire format reads it: a
number whose type changed (or reused for another type) breaks both ways; a required
field added (proto2) breaks BACKWARD; a field removed breaks BACKWARD only where the new
version refuses unknown fields (old messages still carry it); a field added breaks
FORWARD only where the old version refuses unknown fields.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from .errors import InvalidSchemaError

Field = descriptor_pb2.FieldDescriptorProto
MAX_DESCRIPTOR_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ProtobufSchema:
    """A protobuf message type for binary payloads."""

    descriptor_set: bytes
    message: str
    allow_unknown: bool = False
    _messages: dict[str, descriptor_pb2.DescriptorProto] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if len(self.descriptor_set) > MAX_DESCRIPTOR_BYTES:
            raise InvalidSchemaError(f"a descriptor set is at most {MAX_DESCRIPTOR_BYTES} bytes")
        try:
            files = descriptor_pb2.FileDescriptorSet.FromString(self.descriptor_set)
        except DecodeError as exc:
            raise InvalidSchemaError(f"not a FileDescriptorSet: {exc}") from None
        for proto in files.file:
            prefix = f".{proto.package}" if proto.package else ""
            for name, message in _walk(prefix, proto.message_type):
                self._messages[name] = message
        if f".{self.message}" not in self._messages:
            raise InvalidSchemaError(f"the descriptor set holds no message {self.message!r}")
        self.message_class()  # the pool must build: dependencies present, names resolved

    @property
    def kind(self) -> str:
        return "protobuf"

    def message_class(self) -> type[Message]:
        pool = descriptor_pool.DescriptorPool()
        try:
            for proto in descriptor_pb2.FileDescriptorSet.FromString(self.descriptor_set).file:
                pool.Add(proto)
            found: type[Message] = message_factory.GetMessageClass(
                pool.FindMessageTypeByName(self.message)
            )
        except (TypeError, KeyError, ValueError) as exc:
            raise InvalidSchemaError(f"the descriptor set does not build: {exc}") from None
        return found

    def to_stored(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "descriptor_set": base64.b64encode(self.descriptor_set).decode(),
            "message": self.message,
            "allow_unknown": self.allow_unknown,
        }

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> ProtobufSchema:
        return cls(
            base64.b64decode(stored["descriptor_set"]),
            stored["message"],
            bool(stored.get("allow_unknown")),
        )

    def fields(self, type_name: str | None = None) -> dict[int, Field]:
        """The fields of message ``type_name`` (default: the schema's), by number."""
        message = self._messages[type_name or f".{self.message}"]
        return {f.number: f for f in message.field}


def _walk(
    prefix: str, messages: Sequence[descriptor_pb2.DescriptorProto]
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    for message in messages:
        name = f"{prefix}.{message.name}"
        yield name, message
        yield from _walk(name, message.nested_type)


class CompiledProtobuf:
    """A protobuf version's message class, built once per process."""

    def __init__(self, schema: ProtobufSchema) -> None:
        self.schema = schema
        self.cls = schema.message_class()

    def problem(self, payload: bytes) -> tuple[str, str] | None:
        """(rule, message) when ``payload`` does not fit, else ``None``."""
        message = self.cls()
        try:
            message.ParseFromString(payload)
        except DecodeError as exc:
            return "protobuf", f"does not parse as {self.schema.message}: {exc}"
        if not self.schema.allow_unknown:
            size = message.ByteSize()
            message.DiscardUnknownFields()
            if message.ByteSize() != size:
                return "unknown_fields", f"has fields {self.schema.message} does not define"
        return None


def protobuf_breaks(
    reader: ProtobufSchema, writer: ProtobufSchema, *, new_reads: bool
) -> list[str]:
    """Why ``reader`` may refuse a message ``writer`` accepts (empty: it never does)."""
    return _compare(reader, writer, None, None, "", new_reads, set())


def _compare(
    reader: ProtobufSchema,
    writer: ProtobufSchema,
    r_type: str | None,
    w_type: str | None,
    where: str,
    new_reads: bool,
    seen: set[tuple[str | None, str | None]],
) -> list[str]:
    if (r_type, w_type) in seen:  # a recursive message: compared once
        return []
    seen.add((r_type, w_type))
    r_fields, w_fields = reader.fields(r_type), writer.fields(w_type)
    found: list[str] = []
    for number in sorted(set(r_fields) | set(w_fields)):
        r, w = r_fields.get(number), w_fields.get(number)
        name = f"{where}{(r or w).name}"  # type: ignore[union-attr]
        if r is not None and w is not None:
            if _shape(r) != _shape(w):
                old, new = (_shape(w), _shape(r)) if new_reads else (_shape(r), _shape(w))
                found.append(f"field `{name}` ({number}) changed type {old} -> {new}")
            elif r.type == Field.TYPE_MESSAGE:
                inner = f"{name}."
                found += _compare(reader, writer, r.type_name, w.type_name, inner, new_reads, seen)
            if r.label == Field.LABEL_REQUIRED and w.label != Field.LABEL_REQUIRED:
                found.append(f"field `{name}` ({number}) became required" if new_reads
                             else f"field `{name}` ({number}) is no longer required")  # fmt: skip
        elif r is not None and r.label == Field.LABEL_REQUIRED:
            found.append(f"field `{name}` ({number}) added as required" if new_reads
                         else f"field `{name}` ({number}) removed while required")  # fmt: skip
        elif w is not None and not reader.allow_unknown:
            found.append(
                f"field `{name}` ({number}) removed, and the new version refuses unknown fields"
                if new_reads
                else f"field `{name}` ({number}) added, and the old version refuses unknown fields"
            )
    return found


def _shape(f: Field) -> str:
    kind = f.type_name.lstrip(".") if f.type_name else Field.Type.Name(f.type)[5:].lower()
    return f"repeated {kind}" if f.label == Field.LABEL_REPEATED else kind
