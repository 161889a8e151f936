"""Compatibility between two versions of a JSON Schema, as Confluent's modes mean it.

One question answers every mode: can a *reader* schema accept every message a *writer*
schema accepts? BACKWARD asks it with the new version reading the old one's messages,
FORWARD the other way round, FULL both. The answer is found keyword by keyword, walking
both schemas together, and it is conservative: a change it cannot prove safe (a
``$ref``, an ``anyOf`` that changed, a keyword it does not model) is reported as a break,
so a mode other than NONE never lets an incompatible version through. Each break is named
from the old version to the new one, e.g. "field `qty` changed type number -> string".

The verdicts match Confluent's JSON Schema rules on the usual changes: adding an optional
field is compatible only where the old schema refused unknown fields
(``additionalProperties: false``), since elsewhere old messages may hold anything under
that name; adding a required field breaks BACKWARD unless it has a default; removing a
field breaks only where the new schema refuses unknown fields; widening a type or an enum
is BACKWARD compatible, narrowing it is not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .protobuf_schema import ProtobufSchema, protobuf_breaks
from .schemas import Compatibility, JsonSchema, SchemaVersion

__all__ = ["breaks", "incompatibilities"]

Document = Mapping[str, Any] | bool
Schema = JsonSchema | ProtobufSchema

ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "$comment", "$id", "$schema",
        "$anchor", "format", "readOnly", "writeOnly", "deprecated", "$defs", "definitions",
        "contentMediaType", "contentEncoding",
    }
)  # fmt: skip
MODELLED = frozenset(
    {
        "type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "multipleOf", "minLength", "maxLength", "pattern", "items", "minItems", "maxItems",
        "uniqueItems", "properties", "required", "additionalProperties", "minProperties",
        "maxProperties",
    }
)  # fmt: skip


def incompatibilities(
    mode: Compatibility, new: JsonSchema | ProtobufSchema, earlier: Sequence[SchemaVersion]
) -> list[tuple[int, list[str]]]:
    """For each earlier version the mode checks ``new`` against (the last one, or all of
    them for a transitive mode), the breaks found; empty when ``new`` may be set."""
    if mode is Compatibility.NONE or not earlier:
        return []
    against = earlier if mode.transitive else earlier[-1:]
    found = []
    for old in against:
        problems: list[str] = []
        if mode.backward:
            problems += _breaks(new, old.schema, new_reads=True)
        if mode.forward:
            problems += [p for p in _breaks(old.schema, new, new_reads=False)
                         if p not in problems]  # fmt: skip
        if problems:
            found.append((old.version, problems))
    return found


def _breaks(reader: Schema, writer: Schema, *, new_reads: bool) -> list[str]:
    if isinstance(reader, ProtobufSchema) and isinstance(writer, ProtobufSchema):
        return protobuf_breaks(reader, writer, new_reads=new_reads)
    if isinstance(reader, JsonSchema) and isinstance(writer, JsonSchema):
        return breaks(reader.document, writer.document, new_reads=new_reads)
    old, new = (writer, reader) if new_reads else (reader, writer)
    return [f"the kind changed from {old.kind} to {new.kind}"]


def breaks(reader: Document, writer: Document, *, new_reads: bool, where: str = "") -> list[str]:
    """Why ``reader`` may refuse a message ``writer`` accepts (empty: it never does).
    ``new_reads`` says whether the reader is the new version (for naming old -> new)."""
    return _Walk(new_reads).compare(reader, writer, where)


class _Walk:
    def __init__(self, new_reads: bool) -> None:
        self.new_reads = new_reads

    def old_new(self, reader: object, writer: object) -> tuple[object, object]:
        return (writer, reader) if self.new_reads else (reader, writer)

    def compare(self, reader: Document, writer: Document, where: str) -> list[str]:
        name = f"field `{where}`" if where else "the message"
        if writer is False or reader is True or reader == writer:
            return []
        if reader is False:
            return [f"{name} accepts nothing any more"]
        writer_map: Mapping[str, Any] = {} if writer is True else writer
        reader_map: Mapping[str, Any] = reader
        found: list[str] = []
        for keyword in sorted(set(reader_map) | set(writer_map)):
            if keyword in ANNOTATIONS or keyword in MODELLED:
                continue
            if reader_map.get(keyword) != writer_map.get(keyword):
                old, new = self.old_new(reader_map.get(keyword), writer_map.get(keyword))
                found.append(f"{name}: `{keyword}` changed from {_show(old)} to {_show(new)}")
        found += self.types(reader_map, writer_map, name)
        found += self.values(reader_map, writer_map, name)
        found += self.bounds(reader_map, writer_map, name)
        found += self.arrays(reader_map, writer_map, where, name)
        found += self.objects(reader_map, writer_map, where, name)
        return found

    def types(self, reader: Mapping[str, Any], writer: Mapping[str, Any], name: str) -> list[str]:
        accepted = _types(reader)
        if accepted is None:
            return []
        given = _types(writer)
        if given is None:
            return [f"{name} now must be {' or '.join(sorted(accepted))}"]
        refused = {t for t in given if t not in accepted and not _widens(t, accepted)}
        if not refused:
            return []
        old, new = self.old_new(" or ".join(sorted(accepted)), " or ".join(sorted(given)))
        return [f"{name} changed type {old} -> {new}"]

    def values(self, reader: Mapping[str, Any], writer: Mapping[str, Any], name: str) -> list[str]:
        allowed = _enum(reader)
        if allowed is None:
            return []
        given = _enum(writer)
        if given is None:
            return [f"{name} is now limited to {_show(allowed)}"]
        missing = [v for v in given if v not in allowed]
        if not missing:
            return []
        if self.new_reads:
            return [f"{name}: enum narrowed, {_show(missing)} removed"]
        return [f"{name}: enum extended with {_show(missing)}, which the old version refuses"]

    def bounds(self, reader: Mapping[str, Any], writer: Mapping[str, Any], name: str) -> list[str]:
        found = []
        for keyword, tighter in (
            ("minimum", _greater), ("exclusiveMinimum", _greater), ("minLength", _greater),
            ("minItems", _greater), ("minProperties", _greater),
            ("maximum", _less), ("exclusiveMaximum", _less), ("maxLength", _less),
            ("maxItems", _less), ("maxProperties", _less),
        ):  # fmt: skip
            limit = reader.get(keyword)
            if limit is None:
                continue
            given = writer.get(keyword)
            if given is None or tighter(limit, given):
                old, new = self.old_new(limit, given)
                found.append(f"{name}: `{keyword}` changed from {_show(old)} to {_show(new)}")
        step, given_step = reader.get("multipleOf"), writer.get("multipleOf")
        if step is not None and (given_step is None or (given_step / step) % 1 != 0):
            old, new = self.old_new(step, given_step)
            found.append(f"{name}: `multipleOf` changed from {_show(old)} to {_show(new)}")
        if reader.get("pattern") is not None and reader.get("pattern") != writer.get("pattern"):
            old, new = self.old_new(reader.get("pattern"), writer.get("pattern"))
            found.append(f"{name}: `pattern` changed from {_show(old)} to {_show(new)}")
        if reader.get("uniqueItems") is True and writer.get("uniqueItems") is not True:
            found.append(f"{name}: items must now be unique")
        return found

    def arrays(
        self, reader: Mapping[str, Any], writer: Mapping[str, Any], where: str, name: str
    ) -> list[str]:
        if "items" not in reader:
            return []
        return self.compare(reader["items"], writer.get("items", True), f"{where}[]")

    def objects(
        self, reader: Mapping[str, Any], writer: Mapping[str, Any], where: str, name: str
    ) -> list[str]:
        r_props: Mapping[str, Any] = reader.get("properties", {})
        w_props: Mapping[str, Any] = writer.get("properties", {})
        r_more: Document = reader.get("additionalProperties", True)
        w_more: Document = writer.get("additionalProperties", True)
        found = []
        prefix = f"{where}." if where else ""
        required = set(reader.get("required", ())) - set(writer.get("required", ()))
        for field in sorted(required):
            if "default" not in r_props.get(field, {}):
                verb = "became required" if self.new_reads else "is no longer required"
                found.append(f"field `{prefix}{field}` {verb}")
        for field in sorted(set(r_props) | set(w_props)):
            inner = f"{prefix}{field}"
            if field in r_props and field not in w_props:
                if w_more is False or _accepts_anything(r_props[field]):
                    continue  # the writer never has it, or the reader takes anything
                if w_more is True:
                    found.append(
                        f"field `{inner}` added where the old version allowed any other field"
                        if self.new_reads
                        else f"field `{inner}` removed where the new version allows any other field"
                    )
                    continue
                found += self.compare(r_props[field], w_more, inner)
            elif field in w_props and field not in r_props:
                if r_more is False:
                    found.append(
                        f"field `{inner}` removed, and the new version refuses other fields"
                        if self.new_reads
                        else f"field `{inner}` added, and the old version refuses other fields"
                    )
                elif r_more is not True:
                    found += self.compare(r_more, w_props[field], inner)
            else:
                found += self.compare(r_props[field], w_props[field], inner)
        if r_more is not True and w_more is not False:
            found += self.compare(r_more, w_more, f"{prefix}*")
        return found


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _widens(given: str, accepted: set[str]) -> bool:
    return given == "integer" and "number" in accepted


def _enum(schema: Mapping[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    values = schema.get("enum")
    return None if values is None else list(values)


def _accepts_anything(schema: Document) -> bool:
    return schema is True or schema == {}


def _greater(limit: float, given: float) -> bool:
    return limit > given


def _less(limit: float, given: float) -> bool:
    return limit < given


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    return json.dumps(value)
