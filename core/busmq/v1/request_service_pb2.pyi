import datetime

from busmq.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplyPayload(_message.Message):
    __slots__ = ("payload", "kind")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    kind: _types_pb2.PayloadKind
    def __init__(self, payload: _Optional[bytes] = ..., kind: _Optional[_Union[_types_pb2.PayloadKind, str]] = ...) -> None: ...

class CallRequest(_message.Message):
    __slots__ = ("service", "request", "timeout")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    service: str
    request: _types_pb2.OutgoingMessage
    timeout: _duration_pb2.Duration
    def __init__(self, service: _Optional[str] = ..., request: _Optional[_Union[_types_pb2.OutgoingMessage, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CallResponse(_message.Message):
    __slots__ = ("reply",)
    REPLY_FIELD_NUMBER: _ClassVar[int]
    reply: ReplyPayload
    def __init__(self, reply: _Optional[_Union[ReplyPayload, _Mapping]] = ...) -> None: ...

class CallStreamRequest(_message.Message):
    __slots__ = ("service", "request", "timeout")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    service: str
    request: _types_pb2.OutgoingMessage
    timeout: _duration_pb2.Duration
    def __init__(self, service: _Optional[str] = ..., request: _Optional[_Union[_types_pb2.OutgoingMessage, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CallStreamResponse(_message.Message):
    __slots__ = ("item", "heartbeat", "state")
    ITEM_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    item: ReplyPayload
    heartbeat: _types_pb2.Heartbeat
    state: _types_pb2.StateEvent
    def __init__(self, item: _Optional[_Union[ReplyPayload, _Mapping]] = ..., heartbeat: _Optional[_Union[_types_pb2.Heartbeat, _Mapping]] = ..., state: _Optional[_Union[_types_pb2.StateEvent, _Mapping]] = ...) -> None: ...

class ServeRequest(_message.Message):
    __slots__ = ("service", "concurrency", "visibility_timeout")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    service: str
    concurrency: int
    visibility_timeout: _duration_pb2.Duration
    def __init__(self, service: _Optional[str] = ..., concurrency: _Optional[int] = ..., visibility_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ServeResponse(_message.Message):
    __slots__ = ("started", "request", "heartbeat", "state")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    started: ServeStarted
    request: ServedRequest
    heartbeat: _types_pb2.Heartbeat
    state: _types_pb2.StateEvent
    def __init__(self, started: _Optional[_Union[ServeStarted, _Mapping]] = ..., request: _Optional[_Union[ServedRequest, _Mapping]] = ..., heartbeat: _Optional[_Union[_types_pb2.Heartbeat, _Mapping]] = ..., state: _Optional[_Union[_types_pb2.StateEvent, _Mapping]] = ...) -> None: ...

class ServeStarted(_message.Message):
    __slots__ = ("concurrency",)
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    concurrency: int
    def __init__(self, concurrency: _Optional[int] = ...) -> None: ...

class ServedRequest(_message.Message):
    __slots__ = ("request_id", "message", "delivery_count")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    message: _types_pb2.Message
    delivery_count: int
    def __init__(self, request_id: _Optional[str] = ..., message: _Optional[_Union[_types_pb2.Message, _Mapping]] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class ReplyRequest(_message.Message):
    __slots__ = ("request_id", "value", "chunks", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    value: ReplyPayload
    chunks: ReplyChunks
    error: ReplyError
    def __init__(self, request_id: _Optional[str] = ..., value: _Optional[_Union[ReplyPayload, _Mapping]] = ..., chunks: _Optional[_Union[ReplyChunks, _Mapping]] = ..., error: _Optional[_Union[ReplyError, _Mapping]] = ...) -> None: ...

class ReplyChunks(_message.Message):
    __slots__ = ("items", "end")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ReplyPayload]
    end: bool
    def __init__(self, items: _Optional[_Iterable[_Union[ReplyPayload, _Mapping]]] = ..., end: _Optional[bool] = ...) -> None: ...

class ReplyError(_message.Message):
    __slots__ = ("type", "message")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ReplyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
