"""Messages as JSON objects: one line each in ``busmq export`` files, ``busmq tail --json``
and ``busmq dead ls --json``.

    {"id": 7, "time": 1764083471123, "kind": "json", "payload": "{\\"n\\":1}",
     "headers": {"tenant": "a"}}

``payload`` holds the stored bytes exactly: as text for ``text`` and ``json`` payloads
(UTF-8), as base64 for ``bytes``, so an import stores byte-identical messages.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidMessageError
from ..message import EncodedMessage, Message, PayloadKind, encode_headers

KIND_NAMES = {PayloadKind.BYTES: "bytes", PayloadKind.TEXT: "text", PayloadKind.JSON: "json"}
KINDS_BY_NAME = {name: kind for kind, name in KIND_NAMES.items()}


class RecordError(ValueError):
    """A line that is not a message record; says which line and why."""


def to_record(message: Message) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": message.id,
        "time": message.timestamp_ms,
        "kind": KIND_NAMES[message.kind],
    }
    if message.kind is PayloadKind.BYTES:
        record["payload"] = base64.b64encode(message.payload).decode("ascii")
    else:
        record["payload"] = message.payload.decode("utf-8")
    record["headers"] = dict(message.headers)
    return record


def to_line(message: Message) -> str:
    return json.dumps(to_record(message), ensure_ascii=False, separators=(",", ":"))


def from_record(record: Mapping[str, Any]) -> EncodedMessage:
    """The message a record describes, ready to push."""
    kind = KINDS_BY_NAME.get(record.get("kind", "bytes"))
    if kind is None:
        raise RecordError(f"unknown kind {record.get('kind')!r}")
    payload = record.get("payload")
    if not isinstance(payload, str):
        raise RecordError("payload must be a string")
    if kind is PayloadKind.BYTES:
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise RecordError(f"payload is not base64: {exc}") from None
    else:
        data = payload.encode("utf-8")
        if kind is PayloadKind.JSON:
            try:
                json.loads(payload)
            except ValueError as exc:
                raise RecordError(f"json payload does not parse: {exc}") from None
    headers = record.get("headers") or {}
    if not isinstance(headers, dict):
        raise RecordError("headers must be a JSON object")
    try:
        return EncodedMessage(data, kind, encode_headers(headers))
    except InvalidMessageError as exc:
        raise RecordError(str(exc)) from None


def parse_line(line: str, number: int) -> EncodedMessage:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise RecordError(f"line {number}: not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise RecordError(f"line {number}: not a JSON object")
    try:
        return from_record(record)
    except RecordError as exc:
        raise RecordError(f"line {number}: {exc}") from None
