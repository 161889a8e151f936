import datetime

from busmq.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConnectChannelRequest(_message.Message):
    __slots__ = ("channel", "local_role", "remote_role", "listen", "mode", "from_id", "prefetch", "visibility_timeout", "ttl")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ROLE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ROLE_FIELD_NUMBER: _ClassVar[int]
    LISTEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    channel: str
    local_role: str
    remote_role: str
    listen: bool
    mode: _types_pb2.ConsumeMode
    from_id: int
    prefetch: int
    visibility_timeout: _duration_pb2.Duration
    ttl: _duration_pb2.Duration
    def __init__(self, channel: _Optional[str] = ..., local_role: _Optional[str] = ..., remote_role: _Optional[str] = ..., listen: _Optional[bool] = ..., mode: _Optional[_Union[_types_pb2.ConsumeMode, str]] = ..., from_id: _Optional[int] = ..., prefetch: _Optional[int] = ..., visibility_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ConnectChannelResponse(_message.Message):
    __slots__ = ("started", "delivery", "heartbeat", "state")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    started: ChannelStarted
    delivery: _types_pb2.Delivery
    heartbeat: _types_pb2.Heartbeat
    state: _types_pb2.StateEvent
    def __init__(self, started: _Optional[_Union[ChannelStarted, _Mapping]] = ..., delivery: _Optional[_Union[_types_pb2.Delivery, _Mapping]] = ..., heartbeat: _Optional[_Union[_types_pb2.Heartbeat, _Mapping]] = ..., state: _Optional[_Union[_types_pb2.StateEvent, _Mapping]] = ...) -> None: ...

class ChannelStarted(_message.Message):
    __slots__ = ("connection_id", "role", "peer_role")
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PEER_ROLE_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    role: str
    peer_role: str
    def __init__(self, connection_id: _Optional[str] = ..., role: _Optional[str] = ..., peer_role: _Optional[str] = ...) -> None: ...

class SendChannelRequest(_message.Message):
    __slots__ = ("connection_id", "messages", "request_id")
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.OutgoingMessage]
    request_id: str
    def __init__(self, connection_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_types_pb2.OutgoingMessage, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SendChannelResponse(_message.Message):
    __slots__ = ("ids", "duplicate")
    IDS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    duplicate: bool
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SendToRoleRequest(_message.Message):
    __slots__ = ("channel", "role", "messages", "request_id", "ttl")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    channel: str
    role: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.OutgoingMessage]
    request_id: str
    ttl: _duration_pb2.Duration
    def __init__(self, channel: _Optional[str] = ..., role: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_types_pb2.OutgoingMessage, _Mapping]]] = ..., request_id: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SendToRoleResponse(_message.Message):
    __slots__ = ("ids", "duplicate")
    IDS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    duplicate: bool
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class AckChannelRequest(_message.Message):
    __slots__ = ("channel", "role", "ids")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    channel: str
    role: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, channel: _Optional[str] = ..., role: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AckChannelResponse(_message.Message):
    __slots__ = ("acked", "unknown_ids")
    ACKED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_IDS_FIELD_NUMBER: _ClassVar[int]
    acked: int
    unknown_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, acked: _Optional[int] = ..., unknown_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DisconnectChannelRequest(_message.Message):
    __slots__ = ("connection_id",)
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    def __init__(self, connection_id: _Optional[str] = ...) -> None: ...

class DisconnectChannelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndChannelRequest(_message.Message):
    __slots__ = ("connection_id",)
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    def __init__(self, connection_id: _Optional[str] = ...) -> None: ...

class EndChannelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
