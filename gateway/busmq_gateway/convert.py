"""Conversions between protobuf messages and core objects, with request validation."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import duration_pb2

from busmq import MessageTooLargeError, Mode
from busmq.federation.convert import value_to_payload as value_to_payload
from busmq.message import Delivery, EncodedMessage, Message, Payload, PayloadKind
from busmq.v1 import types_pb2
from busmq.wire import KIND_FROM_PROTO, KIND_TO_PROTO, MODE_FROM_PROTO

from .errors import RequestError

MAX_BATCH = 10_000
MAX_HEADERS = 64
"""Headers per message: enough for routing and tracing, not a second payload."""
MAX_HEADER_NAME = 256


def consume_mode(value: types_pb2.ConsumeMode) -> Mode:
    mode = MODE_FROM_PROTO.get(value)
    if mode is None:
        raise RequestError(f"unknown consume mode {value}")
    return mode


def outgoing_to_core(message: types_pb2.OutgoingMessage, index: int | str) -> EncodedMessage:
    """Validate an outgoing message and encode it for the core (no re-encoding of JSON).

    ``index`` is its position in ``messages``, or the name of the field holding it."""
    kind = KIND_FROM_PROTO.get(message.kind)
    if kind is None:
        raise RequestError(f"{_where(index)}: unknown payload kind {message.kind}")
    payload = message.payload
    if kind is not PayloadKind.BYTES:
        _check_text(payload, kind, index)
    headers = message.headers
    if not headers:  # the common case, built per pushed message: nothing more to do
        return EncodedMessage(payload, kind, b"")
    return EncodedMessage(payload, kind, _encoded_headers(headers, index))


def _where(index: int | str) -> str:
    return f"messages[{index}]" if isinstance(index, int) else index


def _check_text(payload: bytes, kind: PayloadKind, index: int | str) -> None:
    try:
        text = payload.decode("utf-8")
        if kind is PayloadKind.JSON:
            json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(
            f"{_where(index)}: payload is not valid {kind.name.lower()}: {exc}",
            reason="INVALID_MESSAGE",
        ) from None


def _encoded_headers(headers: Mapping[str, str], index: int | str) -> bytes:
    if len(headers) > MAX_HEADERS:
        raise RequestError(
            f"{_where(index)}: at most {MAX_HEADERS} headers per message",
            reason="INVALID_MESSAGE",
        )
    if any(not key or len(key) > MAX_HEADER_NAME for key in headers):
        raise RequestError(
            f"{_where(index)}: header names must be 1-{MAX_HEADER_NAME} characters",
            reason="INVALID_MESSAGE",
        )
    return json.dumps(dict(headers), separators=(",", ":")).encode()


def outgoing_batch(
    messages: Sequence[types_pb2.OutgoingMessage], limit: int
) -> list[EncodedMessage]:
    """Validate and encode a batch to push: 1 to ``MAX_BATCH`` messages of at most
    ``limit`` bytes each."""
    if not messages:
        raise RequestError("messages must not be empty")
    if len(messages) > MAX_BATCH:
        raise RequestError(f"at most {MAX_BATCH} messages per push")
    encoded = [outgoing_to_core(m, i) for i, m in enumerate(messages)]
    for message in encoded:
        if message.size > limit:
            raise MessageTooLargeError(message.size, limit)
    return encoded


def check_push_many(pushes: Sequence[Any]) -> None:
    """Bound a ``PushMany`` as one push is bounded: 1 to ``MAX_BATCH`` pushes holding at
    most ``MAX_BATCH`` messages in all (its size in bytes is bounded by gRPC's
    ``max_receive_message_length``, the gateway's ``max_message_bytes``)."""
    if not pushes:
        raise RequestError("pushes must not be empty")
    if len(pushes) > MAX_BATCH:
        raise RequestError(f"at most {MAX_BATCH} pushes per call")
    if sum(len(push.messages) for push in pushes) > MAX_BATCH:
        raise RequestError(f"at most {MAX_BATCH} messages per call")


def outgoing_to_value(
    message: types_pb2.OutgoingMessage, field_name: str
) -> tuple[Payload, dict[str, str]]:
    """A validated outgoing message as the core's value (bytes, str or JSON) and headers."""
    encoded = outgoing_to_core(message, field_name)
    value: Payload = Message(0, encoded.payload, encoded.kind).data
    return value, dict(message.headers)


def payload_to_value(payload: bytes, kind: types_pb2.PayloadKind, field_name: str) -> Any:
    """A validated payload (without headers) as the core's value."""
    message = types_pb2.OutgoingMessage(payload=payload, kind=kind)
    return outgoing_to_value(message, field_name)[0]


def message_fields(message: Message, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """``message`` as the fields of a ``types_pb2.Message``, submessages as dicts.

    For the delivery paths: protobuf turns nested dicts into messages in C, about 3x
    cheaper than building each submessage (and copying it into its parent) in Python.
    """
    ms = message.timestamp_ms
    fields: dict[str, Any] = {
        "id": message.id,
        "payload": message.payload,
        "kind": KIND_TO_PROTO[message.kind],
        "push_time": {"seconds": ms // 1000, "nanos": ms % 1000 * 1_000_000},
    }
    if headers is None and message.headers:
        headers = dict(message.headers)
    if headers:
        fields["headers"] = headers
    if message.schema_version is not None:
        fields["schema_version"] = message.schema_version
    return fields


def delivery_fields(delivery: Delivery) -> dict[str, Any]:
    """``delivery`` as the fields of a ``types_pb2.Delivery`` (see :func:`message_fields`)."""
    return {
        "message": message_fields(delivery.message),
        "delivery_count": delivery.delivery_count,
    }


def message_to_proto(message: Message, headers: dict[str, str] | None = None) -> types_pb2.Message:
    return types_pb2.Message(**message_fields(message, headers))


def check_json_fields(fields: Mapping[str, str]) -> None:
    """Refuse empty field names and texts that are not strict JSON (``NaN`` and
    ``Infinity`` are not JSON values)."""
    for name, text in fields.items():
        if not name:
            raise RequestError("field names must be non-empty")
        try:
            json.loads(text, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise RequestError(
                f"field {name!r}: not valid JSON: {exc}", reason="INVALID_MESSAGE"
            ) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def optional_seconds(message: Any, field_name: str, default: float | None = None) -> float | None:
    """The duration field ``field_name`` of ``message`` in seconds (``default`` if unset);
    it must be positive when set."""
    if not message.HasField(field_name):
        return default
    value = seconds(getattr(message, field_name), field_name)
    if value <= 0:
        raise RequestError(f"{field_name} must be positive")
    return value


MAX_DURATION_SECONDS = 100 * 365.25 * 24 * 3600
"""The longest duration a request may give (any ttl, timeout or delay): beyond it, the
milliseconds Redis computes with would leave its integer range."""


def seconds(duration: duration_pb2.Duration, field_name: str) -> float:
    """A request's duration in seconds; refuses negative, invalid (nanos out of range or
    of the other sign) and absurdly long ones."""
    nanos_ok = -999_999_999 <= duration.nanos <= 999_999_999 and (
        duration.seconds * duration.nanos >= 0
    )
    if not nanos_ok:
        raise RequestError(f"{field_name} is not a valid duration (nanos out of range)")
    value = duration.seconds + duration.nanos / 1e9
    if value < 0:
        raise RequestError(f"{field_name} must not be negative")
    if value > MAX_DURATION_SECONDS:
        raise RequestError(f"{field_name} must be at most 100 years")
    return value


def duration(value: float) -> duration_pb2.Duration:
    result = duration_pb2.Duration()
    result.FromMilliseconds(int(value * 1000))
    return result
