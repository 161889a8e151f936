"""Conversions between core messages and the ``busmq.v1`` protobuf messages."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence

from google.protobuf import duration_pb2

from ..message import Delivery, EncodedMessage, Message, PayloadKind
from ..v1 import types_pb2
from ..wire import KIND_FROM_PROTO, KIND_TO_PROTO

Settle = Callable[[int, bool], Awaitable[None]]


def outgoing(messages: Sequence[EncodedMessage]) -> list[types_pb2.OutgoingMessage]:
    """Encoded core messages as ``OutgoingMessage`` (payload bytes are not re-encoded)."""
    result = []
    for message in messages:
        headers = json.loads(message.headers) if message.headers else {}
        result.append(
            types_pb2.OutgoingMessage(
                payload=message.payload, kind=KIND_TO_PROTO[message.kind], headers=headers
            )
        )
    return result


def delivery(proto: types_pb2.Delivery, settle: Settle | None) -> Delivery:
    """A core :class:`~busmq.Delivery` from a streamed one; ``settle`` backs ack/nack."""
    message = proto.message
    return Delivery(
        Message(
            id=message.id,
            payload=message.payload,
            kind=KIND_FROM_PROTO.get(message.kind, PayloadKind.BYTES),
            headers=dict(message.headers),
            timestamp_ms=message.push_time.ToMilliseconds(),
        ),
        proto.delivery_count or 1,
        settle,
    )


def duration(seconds: float) -> duration_pb2.Duration:
    result = duration_pb2.Duration()
    result.FromMilliseconds(int(seconds * 1000))
    return result


def seconds(value: duration_pb2.Duration) -> float:
    return float(value.seconds + value.nanos / 1e9)
