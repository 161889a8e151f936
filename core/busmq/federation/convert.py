"""Conversions between core messages and the ``busmq.v1`` protobuf messages."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from google.protobuf import duration_pb2

from ..controls import Settlement
from ..message import NO_HEADERS, Delivery, EncodedMessage, Message, PayloadKind, encode
from ..v1 import types_pb2
from ..wire import KIND_FROM_PROTO, KIND_TO_PROTO

Settle = Callable[[int, bool], Awaitable[None]]
Control = Callable[[int, Settlement], Awaitable[None]]


def outgoing(messages: Sequence[EncodedMessage]) -> list[dict[str, Any]]:
    """Encoded core messages as the fields of ``OutgoingMessage`` (payload bytes are not
    re-encoded). Dicts, because protobuf builds the messages from them in C, about 4x
    cheaper than building each in Python."""
    result = []
    for message in messages:
        fields: dict[str, Any] = {"payload": message.payload, "kind": KIND_TO_PROTO[message.kind]}
        if message.headers:
            fields["headers"] = json.loads(message.headers)
        result.append(fields)
    return result


def delivery(
    proto: types_pb2.Delivery, settle: Settle | None, control: Control | None = None
) -> Delivery:
    """A core :class:`~busmq.Delivery` from a streamed one; ``settle`` backs ack/nack,
    ``control`` nack with a delay and reject."""
    return Delivery(message_from_proto(proto.message), proto.delivery_count or 1, settle, control)


def message_from_proto(proto: types_pb2.Message) -> Message:
    """A core :class:`~busmq.Message` from a received one."""
    push_time = proto.push_time
    headers = proto.headers
    return Message(
        proto.id,
        proto.payload,
        KIND_FROM_PROTO.get(proto.kind, PayloadKind.BYTES),
        dict(headers) if headers else NO_HEADERS,
        push_time.seconds * 1000 + push_time.nanos // 1_000_000,
    )


def payload_value(payload: bytes, kind: types_pb2.PayloadKind) -> Any:
    """A received payload (without headers) as the core's value: bytes, str or JSON."""
    return Message(0, payload, KIND_FROM_PROTO.get(kind, PayloadKind.BYTES)).data


def value_to_payload(value: Any) -> tuple[bytes, types_pb2.PayloadKind]:
    """A core value (bytes, str or a JSON value) as payload bytes and kind; used by the
    gateway (replies to requesters) and by federated handlers (replies they send).

    Raises:
        InvalidMessageError: the value is none of those (e.g. a list holding bytes).
    """
    encoded = encode(value, None, sys.maxsize)
    return encoded.payload, KIND_TO_PROTO[encoded.kind]


def duration(seconds: float) -> duration_pb2.Duration:
    result = duration_pb2.Duration()
    result.FromMilliseconds(int(seconds * 1000))
    return result


def seconds(value: duration_pb2.Duration) -> float:
    return float(value.seconds + value.nanos / 1e9)
