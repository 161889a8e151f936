import datetime

from busmq.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SchemaCompatibility(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEMA_COMPATIBILITY_UNSPECIFIED: _ClassVar[SchemaCompatibility]
    SCHEMA_COMPATIBILITY_BACKWARD: _ClassVar[SchemaCompatibility]
    SCHEMA_COMPATIBILITY_BACKWARD_TRANSITIVE: _ClassVar[SchemaCompatibility]
    SCHEMA_COMPATIBILITY_FORWARD: _ClassVar[SchemaCompatibility]
    SCHEMA_COMPATIBILITY_FORWARD_TRANSITIVE: _ClassVar[SchemaCompatibility]
    SCHEMA_COMPATIBILITY_FULL: _ClassVar[SchemaCompatibility]
    SCHEMA_COMPATIBILITY_FULL_TRANSITIVE: _ClassVar[SchemaCompatibility]
    SCHEMA_COMPATIBILITY_NONE: _ClassVar[SchemaCompatibility]
SCHEMA_COMPATIBILITY_UNSPECIFIED: SchemaCompatibility
SCHEMA_COMPATIBILITY_BACKWARD: SchemaCompatibility
SCHEMA_COMPATIBILITY_BACKWARD_TRANSITIVE: SchemaCompatibility
SCHEMA_COMPATIBILITY_FORWARD: SchemaCompatibility
SCHEMA_COMPATIBILITY_FORWARD_TRANSITIVE: SchemaCompatibility
SCHEMA_COMPATIBILITY_FULL: SchemaCompatibility
SCHEMA_COMPATIBILITY_FULL_TRANSITIVE: SchemaCompatibility
SCHEMA_COMPATIBILITY_NONE: SchemaCompatibility

class SchemaVersion(_message.Message):
    __slots__ = ("version", "json_schema", "create_time", "protobuf")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    PROTOBUF_FIELD_NUMBER: _ClassVar[int]
    version: int
    json_schema: str
    create_time: _timestamp_pb2.Timestamp
    protobuf: ProtobufSchema
    def __init__(self, version: _Optional[int] = ..., json_schema: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., protobuf: _Optional[_Union[ProtobufSchema, _Mapping]] = ...) -> None: ...

class ProtobufSchema(_message.Message):
    __slots__ = ("descriptor_set", "message", "allow_unknown")
    DESCRIPTOR_SET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    descriptor_set: bytes
    message: str
    allow_unknown: bool
    def __init__(self, descriptor_set: _Optional[bytes] = ..., message: _Optional[str] = ..., allow_unknown: _Optional[bool] = ...) -> None: ...

class SetQueueSchemaRequest(_message.Message):
    __slots__ = ("queue", "json_schema", "compatibility", "protobuf")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_FIELD_NUMBER: _ClassVar[int]
    PROTOBUF_FIELD_NUMBER: _ClassVar[int]
    queue: str
    json_schema: str
    compatibility: SchemaCompatibility
    protobuf: ProtobufSchema
    def __init__(self, queue: _Optional[str] = ..., json_schema: _Optional[str] = ..., compatibility: _Optional[_Union[SchemaCompatibility, str]] = ..., protobuf: _Optional[_Union[ProtobufSchema, _Mapping]] = ...) -> None: ...

class SetQueueSchemaResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: SchemaVersion
    def __init__(self, version: _Optional[_Union[SchemaVersion, _Mapping]] = ...) -> None: ...

class GetQueueSchemaRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class GetQueueSchemaResponse(_message.Message):
    __slots__ = ("current_version", "compatibility", "versions")
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    current_version: int
    compatibility: SchemaCompatibility
    versions: _containers.RepeatedCompositeFieldContainer[SchemaVersion]
    def __init__(self, current_version: _Optional[int] = ..., compatibility: _Optional[_Union[SchemaCompatibility, str]] = ..., versions: _Optional[_Iterable[_Union[SchemaVersion, _Mapping]]] = ...) -> None: ...

class RemoveQueueSchemaRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class RemoveQueueSchemaResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckQueueSchemaRequest(_message.Message):
    __slots__ = ("queue", "messages")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.OutgoingMessage]
    def __init__(self, queue: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_types_pb2.OutgoingMessage, _Mapping]]] = ...) -> None: ...

class CheckQueueSchemaResponse(_message.Message):
    __slots__ = ("version", "violations")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    version: int
    violations: _containers.RepeatedCompositeFieldContainer[SchemaViolation]
    def __init__(self, version: _Optional[int] = ..., violations: _Optional[_Iterable[_Union[SchemaViolation, _Mapping]]] = ...) -> None: ...

class SchemaViolation(_message.Message):
    __slots__ = ("index", "pointer", "rule", "message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    POINTER_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    pointer: str
    rule: str
    message: str
    def __init__(self, index: _Optional[int] = ..., pointer: _Optional[str] = ..., rule: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class AttachQueueRequest(_message.Message):
    __slots__ = ("queue", "ttl", "max_length", "max_age", "max_backlog", "remove_max_backlog")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    REMOVE_MAX_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    queue: str
    ttl: _duration_pb2.Duration
    max_length: int
    max_age: _duration_pb2.Duration
    max_backlog: int
    remove_max_backlog: bool
    def __init__(self, queue: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_length: _Optional[int] = ..., max_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_backlog: _Optional[int] = ..., remove_max_backlog: _Optional[bool] = ...) -> None: ...

class AttachQueueResponse(_message.Message):
    __slots__ = ("attachment_id", "created", "lease_duration")
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    attachment_id: str
    created: bool
    lease_duration: _duration_pb2.Duration
    def __init__(self, attachment_id: _Optional[str] = ..., created: _Optional[bool] = ..., lease_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RenewAttachmentRequest(_message.Message):
    __slots__ = ("attachment_id",)
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    attachment_id: str
    def __init__(self, attachment_id: _Optional[str] = ...) -> None: ...

class RenewAttachmentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DetachQueueRequest(_message.Message):
    __slots__ = ("attachment_id",)
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    attachment_id: str
    def __init__(self, attachment_id: _Optional[str] = ...) -> None: ...

class DetachQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("queue", "messages", "request_id", "durability", "delay", "deliver_at", "ttl", "expires_at", "producer", "producer_epoch", "producer_sequence")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DURABILITY_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.OutgoingMessage]
    request_id: str
    durability: str
    delay: _duration_pb2.Duration
    deliver_at: _timestamp_pb2.Timestamp
    ttl: _duration_pb2.Duration
    expires_at: _timestamp_pb2.Timestamp
    producer: str
    producer_epoch: int
    producer_sequence: int
    def __init__(self, queue: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_types_pb2.OutgoingMessage, _Mapping]]] = ..., request_id: _Optional[str] = ..., durability: _Optional[str] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., producer: _Optional[str] = ..., producer_epoch: _Optional[int] = ..., producer_sequence: _Optional[int] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("ids", "duplicate")
    IDS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    duplicate: bool
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class PushManyRequest(_message.Message):
    __slots__ = ("pushes", "stop_queue_at_failure")
    PUSHES_FIELD_NUMBER: _ClassVar[int]
    STOP_QUEUE_AT_FAILURE_FIELD_NUMBER: _ClassVar[int]
    pushes: _containers.RepeatedCompositeFieldContainer[PushRequest]
    stop_queue_at_failure: bool
    def __init__(self, pushes: _Optional[_Iterable[_Union[PushRequest, _Mapping]]] = ..., stop_queue_at_failure: _Optional[bool] = ...) -> None: ...

class PushManyResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[PushOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[PushOutcome, _Mapping]]] = ...) -> None: ...

class PushOutcome(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: PushResponse
    error: _status_pb2.Status
    def __init__(self, result: _Optional[_Union[PushResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class PushStreamRequest(_message.Message):
    __slots__ = ("sequence", "push")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    push: PushRequest
    def __init__(self, sequence: _Optional[int] = ..., push: _Optional[_Union[PushRequest, _Mapping]] = ...) -> None: ...

class PushStreamResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[PushStreamOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[PushStreamOutcome, _Mapping]]] = ...) -> None: ...

class PushStreamOutcome(_message.Message):
    __slots__ = ("sequence", "result", "error")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    result: PushResponse
    error: _status_pb2.Status
    def __init__(self, sequence: _Optional[int] = ..., result: _Optional[_Union[PushResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("queue", "mode", "from_id", "from_latest", "max", "prefetch", "visibility_timeout", "batch", "max_deliveries", "retry_policy")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_LATEST_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    mode: _types_pb2.ConsumeMode
    from_id: int
    from_latest: bool
    max: int
    prefetch: int
    visibility_timeout: _duration_pb2.Duration
    batch: bool
    max_deliveries: int
    retry_policy: RetryPolicy
    def __init__(self, queue: _Optional[str] = ..., mode: _Optional[_Union[_types_pb2.ConsumeMode, str]] = ..., from_id: _Optional[int] = ..., from_latest: _Optional[bool] = ..., max: _Optional[int] = ..., prefetch: _Optional[int] = ..., visibility_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., batch: _Optional[bool] = ..., max_deliveries: _Optional[int] = ..., retry_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("initial", "factor", "max_delay", "jitter")
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    MAX_DELAY_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    initial: _duration_pb2.Duration
    factor: float
    max_delay: _duration_pb2.Duration
    jitter: float
    def __init__(self, initial: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., factor: _Optional[float] = ..., max_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., jitter: _Optional[float] = ...) -> None: ...

class RateLimit(_message.Message):
    __slots__ = ("limit", "per", "key")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    limit: int
    per: _duration_pb2.Duration
    key: str
    def __init__(self, limit: _Optional[int] = ..., per: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., key: _Optional[str] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("started", "delivery", "heartbeat", "state", "batch")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    started: ConsumeStarted
    delivery: _types_pb2.Delivery
    heartbeat: _types_pb2.Heartbeat
    state: _types_pb2.StateEvent
    batch: DeliveryBatch
    def __init__(self, started: _Optional[_Union[ConsumeStarted, _Mapping]] = ..., delivery: _Optional[_Union[_types_pb2.Delivery, _Mapping]] = ..., heartbeat: _Optional[_Union[_types_pb2.Heartbeat, _Mapping]] = ..., state: _Optional[_Union[_types_pb2.StateEvent, _Mapping]] = ..., batch: _Optional[_Union[DeliveryBatch, _Mapping]] = ...) -> None: ...

class DeliveryBatch(_message.Message):
    __slots__ = ("deliveries", "lapses_after")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    LAPSES_AFTER_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[_types_pb2.Delivery]
    lapses_after: _duration_pb2.Duration
    def __init__(self, deliveries: _Optional[_Iterable[_Union[_types_pb2.Delivery, _Mapping]]] = ..., lapses_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ConsumeStarted(_message.Message):
    __slots__ = ("consumer_id",)
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    def __init__(self, consumer_id: _Optional[str] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("queue", "ids", "up_to_id", "consumer_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    UP_TO_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    up_to_id: int
    consumer_id: str
    def __init__(self, queue: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., up_to_id: _Optional[int] = ..., consumer_id: _Optional[str] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked", "unknown_ids")
    ACKED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_IDS_FIELD_NUMBER: _ClassVar[int]
    acked: int
    unknown_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, acked: _Optional[int] = ..., unknown_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("queue", "consumer_id", "ids", "delay", "error", "give_back")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GIVE_BACK_FIELD_NUMBER: _ClassVar[int]
    queue: str
    consumer_id: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    delay: _duration_pb2.Duration
    error: str
    give_back: bool
    def __init__(self, queue: _Optional[str] = ..., consumer_id: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., error: _Optional[str] = ..., give_back: _Optional[bool] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("unknown_ids",)
    UNKNOWN_IDS_FIELD_NUMBER: _ClassVar[int]
    unknown_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, unknown_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RejectRequest(_message.Message):
    __slots__ = ("queue", "consumer_id", "ids", "reason")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    queue: str
    consumer_id: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    def __init__(self, queue: _Optional[str] = ..., consumer_id: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ...) -> None: ...

class RejectResponse(_message.Message):
    __slots__ = ("unknown_ids",)
    UNKNOWN_IDS_FIELD_NUMBER: _ClassVar[int]
    unknown_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, unknown_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RequeueDeadRequest(_message.Message):
    __slots__ = ("queue", "ids", "limit")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    limit: int
    def __init__(self, queue: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., limit: _Optional[int] = ...) -> None: ...

class RequeueDeadResponse(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class UpdateQueueControlsRequest(_message.Message):
    __slots__ = ("queue", "paused", "rate_limit", "remove_rate_limits", "max_deliveries", "drop_expired", "ordering_key")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMOVE_RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DROP_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    paused: bool
    rate_limit: RateLimit
    remove_rate_limits: bool
    max_deliveries: int
    drop_expired: bool
    ordering_key: str
    def __init__(self, queue: _Optional[str] = ..., paused: _Optional[bool] = ..., rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ..., remove_rate_limits: _Optional[bool] = ..., max_deliveries: _Optional[int] = ..., drop_expired: _Optional[bool] = ..., ordering_key: _Optional[str] = ...) -> None: ...

class UpdateQueueControlsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class GetQueueResponse(_message.Message):
    __slots__ = ("queue", "count", "ttl", "last_id", "metadata", "pending", "delayed", "dead_letters", "paused", "rate_limit", "key_rate_limit", "max_deliveries", "drop_expired", "mode", "ordering_key", "ordered_keys_in_flight", "ordered_waiting", "oldest_ordered_wait")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    KEY_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DROP_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    ORDERED_KEYS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ORDERED_WAITING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_ORDERED_WAIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    count: int
    ttl: _duration_pb2.Duration
    last_id: int
    metadata: _containers.ScalarMap[str, str]
    pending: int
    delayed: int
    dead_letters: int
    paused: bool
    rate_limit: RateLimit
    key_rate_limit: RateLimit
    max_deliveries: int
    drop_expired: bool
    mode: str
    ordering_key: str
    ordered_keys_in_flight: int
    ordered_waiting: int
    oldest_ordered_wait: _duration_pb2.Duration
    def __init__(self, queue: _Optional[str] = ..., count: _Optional[int] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., last_id: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., pending: _Optional[int] = ..., delayed: _Optional[int] = ..., dead_letters: _Optional[int] = ..., paused: _Optional[bool] = ..., rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ..., key_rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ..., max_deliveries: _Optional[int] = ..., drop_expired: _Optional[bool] = ..., mode: _Optional[str] = ..., ordering_key: _Optional[str] = ..., ordered_keys_in_flight: _Optional[int] = ..., ordered_waiting: _Optional[int] = ..., oldest_ordered_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class UpdateQueueMetadataRequest(_message.Message):
    __slots__ = ("queue", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    queue: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, queue: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpdateQueueMetadataResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class FlushQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class CloseQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("prefix", "page_size", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    page_size: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "next_page_token", "total")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueSummary]
    next_page_token: str
    total: int
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ...) -> None: ...

class QueueSummary(_message.Message):
    __slots__ = ("queue", "shard", "count", "ready", "pending", "oldest_pending", "consumers", "attachments", "delayed", "dead_letters", "last_id", "delivered", "mode", "paused", "ttl", "rate_limit", "key_rate_limit", "ordering_key", "ordered_keys_in_flight", "ordered_waiting")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    KEY_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    ORDERED_KEYS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ORDERED_WAITING_FIELD_NUMBER: _ClassVar[int]
    queue: str
    shard: str
    count: int
    ready: int
    pending: int
    oldest_pending: _duration_pb2.Duration
    consumers: int
    attachments: int
    delayed: int
    dead_letters: int
    last_id: int
    delivered: int
    mode: str
    paused: bool
    ttl: _duration_pb2.Duration
    rate_limit: RateLimit
    key_rate_limit: RateLimit
    ordering_key: str
    ordered_keys_in_flight: int
    ordered_waiting: int
    def __init__(self, queue: _Optional[str] = ..., shard: _Optional[str] = ..., count: _Optional[int] = ..., ready: _Optional[int] = ..., pending: _Optional[int] = ..., oldest_pending: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., consumers: _Optional[int] = ..., attachments: _Optional[int] = ..., delayed: _Optional[int] = ..., dead_letters: _Optional[int] = ..., last_id: _Optional[int] = ..., delivered: _Optional[int] = ..., mode: _Optional[str] = ..., paused: _Optional[bool] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ..., key_rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ..., ordering_key: _Optional[str] = ..., ordered_keys_in_flight: _Optional[int] = ..., ordered_waiting: _Optional[int] = ...) -> None: ...

class BrowseQueueRequest(_message.Message):
    __slots__ = ("queue", "from_id", "to_id", "follow")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    queue: str
    from_id: int
    to_id: int
    follow: bool
    def __init__(self, queue: _Optional[str] = ..., from_id: _Optional[int] = ..., to_id: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class BrowseQueueResponse(_message.Message):
    __slots__ = ("messages", "heartbeat", "state")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    messages: MessageBatch
    heartbeat: _types_pb2.Heartbeat
    state: _types_pb2.StateEvent
    def __init__(self, messages: _Optional[_Union[MessageBatch, _Mapping]] = ..., heartbeat: _Optional[_Union[_types_pb2.Heartbeat, _Mapping]] = ..., state: _Optional[_Union[_types_pb2.StateEvent, _Mapping]] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[_types_pb2.Message, _Mapping]]] = ...) -> None: ...
