import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PayloadKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAYLOAD_KIND_UNSPECIFIED: _ClassVar[PayloadKind]
    PAYLOAD_KIND_BYTES: _ClassVar[PayloadKind]
    PAYLOAD_KIND_TEXT: _ClassVar[PayloadKind]
    PAYLOAD_KIND_JSON: _ClassVar[PayloadKind]

class ConsumeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSUME_MODE_UNSPECIFIED: _ClassVar[ConsumeMode]
    CONSUME_MODE_AT_MOST_ONCE: _ClassVar[ConsumeMode]
    CONSUME_MODE_AT_LEAST_ONCE: _ClassVar[ConsumeMode]
    CONSUME_MODE_REPLAY: _ClassVar[ConsumeMode]
PAYLOAD_KIND_UNSPECIFIED: PayloadKind
PAYLOAD_KIND_BYTES: PayloadKind
PAYLOAD_KIND_TEXT: PayloadKind
PAYLOAD_KIND_JSON: PayloadKind
CONSUME_MODE_UNSPECIFIED: ConsumeMode
CONSUME_MODE_AT_MOST_ONCE: ConsumeMode
CONSUME_MODE_AT_LEAST_ONCE: ConsumeMode
CONSUME_MODE_REPLAY: ConsumeMode

class OutgoingMessage(_message.Message):
    __slots__ = ("payload", "kind", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    kind: PayloadKind
    headers: _containers.ScalarMap[str, str]
    def __init__(self, payload: _Optional[bytes] = ..., kind: _Optional[_Union[PayloadKind, str]] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("id", "payload", "kind", "headers", "push_time", "schema_version")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    PUSH_TIME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    id: int
    payload: bytes
    kind: PayloadKind
    headers: _containers.ScalarMap[str, str]
    push_time: _timestamp_pb2.Timestamp
    schema_version: int
    def __init__(self, id: _Optional[int] = ..., payload: _Optional[bytes] = ..., kind: _Optional[_Union[PayloadKind, str]] = ..., headers: _Optional[_Mapping[str, str]] = ..., push_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., schema_version: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("message", "delivery_count")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    message: Message
    delivery_count: int
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time",)
    TIME_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StateEvent(_message.Message):
    __slots__ = ("kind", "source", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    source: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[str] = ..., source: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...
