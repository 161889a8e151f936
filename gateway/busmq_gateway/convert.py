"""Conversions between protobuf messages and core objects, with request validation."""

from __future__ import annotations

import json

from google.protobuf import duration_pb2, timestamp_pb2

from busmq.message import Delivery, EncodedMessage, PayloadKind
from busmq.v1 import types_pb2

from .errors import RequestError

_KIND_FROM_PROTO = {
    types_pb2.PAYLOAD_KIND_UNSPECIFIED: PayloadKind.BYTES,
    types_pb2.PAYLOAD_KIND_BYTES: PayloadKind.BYTES,
    types_pb2.PAYLOAD_KIND_TEXT: PayloadKind.TEXT,
    types_pb2.PAYLOAD_KIND_JSON: PayloadKind.JSON,
}
_KIND_TO_PROTO = {
    PayloadKind.BYTES: types_pb2.PAYLOAD_KIND_BYTES,
    PayloadKind.TEXT: types_pb2.PAYLOAD_KIND_TEXT,
    PayloadKind.JSON: types_pb2.PAYLOAD_KIND_JSON,
}


def outgoing_to_core(message: types_pb2.OutgoingMessage, index: int) -> EncodedMessage:
    """Validate an outgoing message and encode it for the core (no re-encoding of JSON)."""
    kind = _KIND_FROM_PROTO.get(message.kind)
    if kind is None:
        raise RequestError(f"messages[{index}]: unknown payload kind {message.kind}")
    payload = bytes(message.payload)
    if kind is not PayloadKind.BYTES:
        try:
            text = payload.decode("utf-8")
            if kind is PayloadKind.JSON:
                json.loads(text)
        except (UnicodeDecodeError, ValueError) as exc:
            raise RequestError(
                f"messages[{index}]: payload is not valid {kind.name.lower()}: {exc}",
                reason="INVALID_MESSAGE",
            ) from None
    headers = b""
    if message.headers:
        if any(not key for key in message.headers):
            raise RequestError(f"messages[{index}]: header names must not be empty")
        headers = json.dumps(dict(message.headers), separators=(",", ":")).encode()
    return EncodedMessage(payload, kind, headers)


def delivery_to_proto(delivery: Delivery) -> types_pb2.Delivery:
    message = delivery.message
    push_time = timestamp_pb2.Timestamp()
    push_time.FromMilliseconds(message.timestamp_ms)
    return types_pb2.Delivery(
        message=types_pb2.Message(
            id=message.id,
            payload=message.payload,
            kind=_KIND_TO_PROTO[message.kind],
            headers=dict(message.headers),
            push_time=push_time,
        ),
        delivery_count=delivery.delivery_count,
    )


def seconds(duration: duration_pb2.Duration, field_name: str) -> float:
    value = duration.seconds + duration.nanos / 1e9
    if value < 0:
        raise RequestError(f"{field_name} must not be negative")
    return value


def duration(value: float) -> duration_pb2.Duration:
    result = duration_pb2.Duration()
    result.FromMilliseconds(int(value * 1000))
    return result
