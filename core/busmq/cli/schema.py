"""``busmq schema QUEUE get|versions|set|check|remove [FILE]``: a queue's schema (see
:mod:`busmq.schemas`), locally or through a gateway."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from ..errors import InvalidMessageError
from ..message import EncodedMessage, PayloadKind
from ..protobuf_schema import ProtobufSchema
from ..schemas import Compatibility, JsonSchema, Schema, SchemaError, SchemaVersion, describe
from .admin import Admin
from .output import Output

ACTIONS = ("get", "versions", "set", "check", "remove")


def add_parser(sub: Any) -> None:
    schema = sub.add_parser("schema", help="a queue's schema: get, versions, set, check, remove")
    schema.add_argument("queue")
    schema.add_argument("action", choices=ACTIONS)
    schema.add_argument(
        "file",
        nargs="?",
        default="-",
        help="set: the JSON Schema; check: one JSON message per line (- for stdin)",
    )
    schema.add_argument(
        "--protobuf",
        metavar="MESSAGE",
        help="set: FILE is a FileDescriptorSet (protoc --include_imports "
        "--descriptor_set_out), the schema this message type of it",
    )
    schema.add_argument(
        "--allow-unknown",
        action="store_true",
        help="set --protobuf: accept fields the type does not define",
    )
    schema.add_argument(
        "--compatibility",
        choices=[mode.value for mode in Compatibility],
        help="set: the queue's compatibility mode from now on",
    )


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    with open(name, encoding="utf-8") as handle:
        return handle.read()


def _schema(args: argparse.Namespace) -> Schema:
    """The schema ``set`` names: FILE's JSON Schema, or with ``--protobuf MESSAGE`` the
    message type in FILE, a serialized FileDescriptorSet."""
    if args.protobuf:
        if args.file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as handle:
                data = handle.read()
        return ProtobufSchema(data, args.protobuf, args.allow_unknown)
    try:
        return JsonSchema(json.loads(_read(args.file)))
    except ValueError as exc:
        raise InvalidMessageError(f"{args.file}: not JSON: {exc}") from None


def _version_json(version: SchemaVersion) -> dict[str, Any]:
    return {
        "version": version.version,
        "created": datetime.fromtimestamp(version.created_ms / 1000, UTC).isoformat(),
        "schema": describe(version.schema),
    }


async def schema(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    if args.action == "set":
        mode = None if args.compatibility is None else Compatibility(args.compatibility)
        version = await admin.set_schema(args.queue, _schema(args), mode)
        if out.as_json:
            out.json(_version_json(version))
        else:
            out.line(f"queue {args.queue}: schema version {version.version}")
        return 0
    if args.action == "remove":
        await admin.remove_schema(args.queue)
        out.note(f"queue {args.queue}: pushes are no longer checked")
        return 0
    if args.action == "check":
        return await _check(admin, out, args)
    state = await admin.schema(args.queue)
    if args.action == "get":
        current = next((v for v in state.versions if v.version == state.current), None)
        if current is None:
            out.note(f"queue {args.queue} has no schema")
            return 0
        # The document alone, as a file to edit and set again; --json: with its version.
        out.json(_version_json(current) if out.as_json else describe(current.schema))
        return 0
    if out.as_json:
        out.json(
            {
                "current_version": state.current,
                "compatibility": str(state.compatibility),
                "versions": [_version_json(v) for v in state.versions],
            }
        )
        return 0
    rows = [
        (v.version, "yes" if v.version == state.current else "", _version_json(v)["created"])
        for v in state.versions
    ]
    title = f"queue {args.queue}: compatibility {state.compatibility}"
    out.table(title, ("version", "current", "created"), rows)
    return 0


async def _check(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    lines = [line for line in _read(args.file).splitlines() if line.strip()]
    messages = [EncodedMessage(line.encode(), PayloadKind.JSON, b"") for line in lines]
    checked = await admin.check_schema(args.queue, messages)
    if checked is None:
        out.note(f"queue {args.queue} has no schema: every message fits")
        return 0
    version, violations = checked
    if out.as_json:
        out.json([{"line": v.index + 1, "pointer": v.pointer, "rule": v.rule,
                   "message": v.message} for v in violations])  # fmt: skip
    else:
        for v in violations:
            out.line(f"line {v.index + 1} at {v.pointer or '/'}: {v.message} ({v.rule})")
    if violations:
        raise SchemaError(args.queue, version, violations)
    out.note(f"{len(messages)} message(s) fit schema version {version} of {args.queue}")
    return 0
