"""busmq: a Redis-backed message bus for asyncio.

import busmq

async with busmq.Bus(redis_urls=("redis://127.0.0.1:6379",)) as bus:
    async with bus.queue("orders") as queue:
        await queue.push({"order": 1})
        async with queue.consume(busmq.Mode.AT_LEAST_ONCE) as consumer:
            async for delivery in consumer:
                ...
                await delivery.ack()
"""

from .bus import Bus, BusState
from .channel import Channel
from .channel_protocol import ChannelState
from .consumer import Consumer
from .consuming import LATEST, Mode
from .controls import QueueInfo, RateLimit, RetryPolicy
from .durability import Durability
from .embedded import EmbeddedRedis
from .errors import (
    BusClosedError,
    BusError,
    BusTimeoutError,
    BusUnavailableError,
    ChannelEndedError,
    ChannelStateError,
    DurabilityError,
    DurabilityUnsupportedError,
    EmbeddedRedisError,
    InvalidMessageError,
    InvalidNameError,
    MessageTooLargeError,
    ModeConflictError,
    NotAttachedError,
    OrderingError,
    ProducerFencedError,
    QueueFullError,
    QueueNotFoundError,
    RequestTimeoutError,
    ServiceError,
    TopologyError,
    UnknownMessageError,
)
from .events import Event, Subscription
from .message import Delivery, Message, PayloadKind
from .ordering import OrderingState
from .persistable import Persistable
from .protobuf_schema import ProtobufSchema
from .pushing import Producer, PushResult
from .queue import Queue, Retention
from .schemas import (
    Compatibility,
    InvalidSchemaError,
    JsonSchema,
    SchemaCompatibilityError,
    SchemaError,
    SchemaVersion,
    Violation,
)
from .service import Request, Service
from .settings import BusSettings

__all__ = [
    "LATEST",
    "Bus",
    "BusClosedError",
    "BusError",
    "BusSettings",
    "BusState",
    "BusTimeoutError",
    "BusUnavailableError",
    "Channel",
    "ChannelEndedError",
    "ChannelState",
    "ChannelStateError",
    "Compatibility",
    "Consumer",
    "Delivery",
    "Durability",
    "DurabilityError",
    "DurabilityUnsupportedError",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "Event",
    "InvalidMessageError",
    "InvalidNameError",
    "InvalidSchemaError",
    "JsonSchema",
    "Message",
    "MessageTooLargeError",
    "Mode",
    "ModeConflictError",
    "NotAttachedError",
    "OrderingError",
    "OrderingState",
    "PayloadKind",
    "Persistable",
    "Producer",
    "ProducerFencedError",
    "ProtobufSchema",
    "PushResult",
    "Queue",
    "QueueFullError",
    "QueueInfo",
    "QueueNotFoundError",
    "RateLimit",
    "Request",
    "RequestTimeoutError",
    "Retention",
    "RetryPolicy",
    "SchemaCompatibilityError",
    "SchemaError",
    "SchemaVersion",
    "Service",
    "ServiceError",
    "Subscription",
    "TopologyError",
    "UnknownMessageError",
    "Violation",
]
