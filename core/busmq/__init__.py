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
from .consumer import LATEST, Consumer, Mode
from .embedded import EmbeddedRedis
from .errors import (
    BusClosedError,
    BusError,
    BusTimeoutError,
    BusUnavailableError,
    EmbeddedRedisError,
    InvalidMessageError,
    InvalidNameError,
    MessageTooLargeError,
    ModeConflictError,
    NotAttachedError,
    QueueFullError,
    QueueNotFoundError,
    UnknownMessageError,
)
from .events import Event, Subscription
from .message import Delivery, Message, PayloadKind
from .queue import Queue, Retention
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
    "Consumer",
    "Delivery",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "Event",
    "InvalidMessageError",
    "InvalidNameError",
    "Message",
    "MessageTooLargeError",
    "Mode",
    "ModeConflictError",
    "NotAttachedError",
    "PayloadKind",
    "Queue",
    "QueueFullError",
    "QueueNotFoundError",
    "Retention",
    "Subscription",
    "UnknownMessageError",
]
