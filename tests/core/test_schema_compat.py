"""Compatibility of JSON Schema versions per mode: the usual changes, each accepted or
refused as Confluent's JSON Schema rules do (pure logic, no Redis)."""

from __future__ import annotations

from typing import Any

import pytest

from busmq import Compatibility, JsonSchema, SchemaVersion
from busmq.schema_compat import incompatibilities

OPEN: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "qty": {"type": "number"}},
    "required": ["id"],
}
CLOSED: dict[str, Any] = {**OPEN, "additionalProperties": False}


def changed(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``base`` with its properties, required list or other keywords replaced."""
    return {**base, **fields}


def props(base: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**base["properties"], **extra}


NOTE = {"type": "string"}
CASES = {
    # change: (old, new)
    "add an optional field (open)": (OPEN, changed(OPEN, properties=props(OPEN, note=NOTE))),
    "add an optional field (closed)": (
        CLOSED,
        changed(CLOSED, properties=props(CLOSED, note=NOTE)),
    ),
    "add a required field": (
        OPEN,
        changed(OPEN, properties=props(OPEN, note=NOTE), required=["id", "note"]),
    ),
    "make a field required": (OPEN, changed(OPEN, required=["id", "qty"])),
    "make a field required, with a default": (
        OPEN,
        changed(
            OPEN,
            properties=props(OPEN, qty={"type": "number", "default": 0}),
            required=["id", "qty"],
        ),
    ),
    "remove a field (open)": (OPEN, changed(OPEN, properties={"id": {"type": "string"}})),
    "remove a field (closed)": (CLOSED, changed(CLOSED, properties={"id": {"type": "string"}})),
    "change a type": (OPEN, changed(OPEN, properties=props(OPEN, qty={"type": "string"}))),
    "widen a type (integer to number)": (
        changed(OPEN, properties=props(OPEN, qty={"type": "integer"})),
        OPEN,
    ),
    "narrow an enum": (
        changed(OPEN, properties=props(OPEN, state={"enum": ["new", "paid", "sent"]})),
        changed(OPEN, properties=props(OPEN, state={"enum": ["new", "paid"]})),
    ),
    "extend an enum": (
        changed(OPEN, properties=props(OPEN, state={"enum": ["new", "paid"]})),
        changed(OPEN, properties=props(OPEN, state={"enum": ["new", "paid", "sent"]})),
    ),
    "raise a minimum": (
        changed(OPEN, properties=props(OPEN, qty={"type": "number", "minimum": 0})),
        changed(OPEN, properties=props(OPEN, qty={"type": "number", "minimum": 1})),
    ),
    "only the description changes": (OPEN, changed(OPEN, description="orders")),
}

# change -> (BACKWARD, FORWARD, FULL) accepted?
EXPECTED = {
    "add an optional field (open)": (False, True, False),
    "add an optional field (closed)": (True, False, False),
    "add a required field": (False, True, False),
    "make a field required": (False, True, False),
    "make a field required, with a default": (True, True, True),
    "remove a field (open)": (True, False, False),
    "remove a field (closed)": (False, True, False),
    "change a type": (False, False, False),
    "widen a type (integer to number)": (True, False, False),
    "narrow an enum": (False, True, False),
    "extend an enum": (True, False, False),
    "raise a minimum": (False, True, False),
    "only the description changes": (True, True, True),
}


@pytest.mark.parametrize("change", sorted(CASES))
def test_each_change_is_accepted_or_refused_per_mode(change: str) -> None:
    old, new = CASES[change]
    earlier = [SchemaVersion(1, JsonSchema(old), 0)]
    modes = (Compatibility.BACKWARD, Compatibility.FORWARD, Compatibility.FULL)
    verdicts = tuple(not incompatibilities(mode, JsonSchema(new), earlier) for mode in modes)
    assert verdicts == EXPECTED[change]
    assert not incompatibilities(Compatibility.NONE, JsonSchema(new), earlier)


def test_a_break_is_named_from_the_old_version_to_the_new() -> None:
    old, new = CASES["change a type"]
    earlier = [SchemaVersion(1, JsonSchema(old), 0)]
    for mode in (Compatibility.BACKWARD, Compatibility.FORWARD):
        [(against, breaks)] = incompatibilities(mode, JsonSchema(new), earlier)
        assert against == 1
        assert breaks == ["field `qty` changed type number -> string"]
    [(_, breaks)] = incompatibilities(
        Compatibility.BACKWARD, JsonSchema(CASES["add a required field"][1]), earlier
    )
    assert breaks == ["field `note` became required", "field `note` added where the old "
                      "version allowed any other field"]  # fmt: skip


def test_transitive_modes_check_every_earlier_version() -> None:
    v1 = JsonSchema(changed(OPEN, properties=props(OPEN, state={"enum": ["a", "b", "c"]})))
    v2 = JsonSchema(changed(OPEN, properties=props(OPEN, state={"enum": ["a", "b", "c", "d"]})))
    v3 = JsonSchema(changed(OPEN, properties=props(OPEN, state={"enum": ["a", "b", "d"]})))
    earlier = [SchemaVersion(1, v1, 0), SchemaVersion(2, v2, 0)]
    # Against the last version only (FORWARD): v2's messages are a-d, v3's a, b, d: fine.
    assert not incompatibilities(Compatibility.FORWARD, v3, earlier[1:])
    # BACKWARD_TRANSITIVE: v3 cannot read c, which v1 and v2 allowed.
    found = incompatibilities(Compatibility.BACKWARD_TRANSITIVE, v3, earlier)
    assert [against for against, _ in found] == [1, 2]


def test_nested_objects_and_arrays_are_walked() -> None:
    def order(sku: str, zip_required: bool) -> dict[str, Any]:
        line = {"type": "object", "properties": {"sku": {"type": sku}}}
        address: dict[str, Any] = {"type": "object", "properties": {"zip": {"type": "string"}}}
        if zip_required:
            address["required"] = ["zip"]
        lines = {"type": "array", "items": line}
        return {"type": "object", "properties": {"lines": lines, "address": address}}

    old, new = order("string", False), order("integer", True)
    [(_, breaks)] = incompatibilities(
        Compatibility.BACKWARD, JsonSchema(new), [SchemaVersion(1, JsonSchema(old), 0)]
    )
    assert sorted(breaks) == [
        "field `address.zip` became required",
        "field `lines[].sku` changed type string -> integer",
    ]


def test_what_it_cannot_prove_safe_is_a_break() -> None:
    old = {"anyOf": [{"type": "string"}, {"type": "number"}]}
    new = {"anyOf": [{"type": "string"}]}
    [(_, breaks)] = incompatibilities(
        Compatibility.BACKWARD, JsonSchema(new), [SchemaVersion(1, JsonSchema(old), 0)]
    )
    assert breaks and "`anyOf` changed" in breaks[0]
