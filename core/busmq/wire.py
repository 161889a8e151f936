"""Mappings between core enums and their ``busmq.v1`` protobuf counterparts, shared by
the gateway (server side) and federation (client side)."""

from __future__ import annotations

from .consuming import Mode
from .message import PayloadKind
from .schemas import Compatibility
from .v1 import queue_service_pb2, types_pb2

KIND_TO_PROTO = {
    PayloadKind.BYTES: types_pb2.PAYLOAD_KIND_BYTES,
    PayloadKind.TEXT: types_pb2.PAYLOAD_KIND_TEXT,
    PayloadKind.JSON: types_pb2.PAYLOAD_KIND_JSON,
}
KIND_FROM_PROTO = {
    types_pb2.PAYLOAD_KIND_UNSPECIFIED: PayloadKind.BYTES,
    types_pb2.PAYLOAD_KIND_BYTES: PayloadKind.BYTES,
    types_pb2.PAYLOAD_KIND_TEXT: PayloadKind.TEXT,
    types_pb2.PAYLOAD_KIND_JSON: PayloadKind.JSON,
}
MODE_TO_PROTO = {
    Mode.AT_MOST_ONCE: types_pb2.CONSUME_MODE_AT_MOST_ONCE,
    Mode.AT_LEAST_ONCE: types_pb2.CONSUME_MODE_AT_LEAST_ONCE,
    Mode.REPLAY: types_pb2.CONSUME_MODE_REPLAY,
}
MODE_FROM_PROTO = {
    types_pb2.CONSUME_MODE_UNSPECIFIED: Mode.AT_MOST_ONCE,
    types_pb2.CONSUME_MODE_AT_MOST_ONCE: Mode.AT_MOST_ONCE,
    types_pb2.CONSUME_MODE_AT_LEAST_ONCE: Mode.AT_LEAST_ONCE,
    types_pb2.CONSUME_MODE_REPLAY: Mode.REPLAY,
}
COMPATIBILITY_TO_PROTO = {
    mode: getattr(queue_service_pb2, f"SCHEMA_COMPATIBILITY_{mode.value}") for mode in Compatibility
}
COMPATIBILITY_FROM_PROTO = {value: mode for mode, value in COMPATIBILITY_TO_PROTO.items()}
