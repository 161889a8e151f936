"""The exceptions busmq raises.

Every exception derives from :class:`BusError`. Input errors also derive from
:class:`ValueError` and timeouts from :class:`TimeoutError`, so callers can catch
them the way they catch the builtins. Redis client exceptions never escape the
core: they are translated at the shard boundary (:mod:`busmq.shard`).

    BusError
    ├── InvalidNameError            (ValueError)  queue/channel name outside the allowed set
    ├── InvalidMessageError         (ValueError)  payload or headers that cannot be encoded
    │   └── MessageTooLargeError                  encoded message above the configured limit
    ├── UnknownMessageError         (ValueError)  ack of ids that are not pending
    ├── NotAttachedError                          operation that needs an attachment
    ├── QueueNotFoundError                        the queue does not exist (expired or closed)
    ├── ModeConflictError                         destructive and replay consumers mixed
    ├── QueueFullError                            push above the queue's max backlog
    ├── BusClosedError                            the bus (or a consumer) was closed
    ├── ChannelStateError                         channel operation in the wrong state
    │   └── ChannelEndedError                     the channel was ended
    ├── ServiceError                              a request's handler raised
    ├── RequestTimeoutError         (TimeoutError) no reply within the request timeout
    ├── RedisCommandError                         Redis refused a command (misconfiguration)
    ├── BusUnavailableError                       Redis unreachable
    │   └── BusTimeoutError         (TimeoutError) an operation ran out of time
    ├── DurabilityError                           a push applied but not confirmed durable
    ├── DurabilityUnsupportedError                the server cannot give the durability asked
    ├── TopologyError                             the deployment is not what its URL says
    └── EmbeddedRedisError                        the embedded redis-server failed
"""

from __future__ import annotations

from collections.abc import Sequence


class BusError(Exception):
    """Root of every busmq exception."""


class InvalidNameError(BusError, ValueError):
    """A queue or channel name is empty, too long, or uses characters outside the allowed set."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid name {name!r}: {reason}")
        self.name = name
        self.reason = reason


class InvalidMessageError(BusError, ValueError):
    """A payload or header set cannot be encoded as a message."""


class InvalidSchemaError(InvalidMessageError):
    """A schema that is not one: not JSON, not a valid JSON Schema, or too large. The
    queue keeps its current version."""


class MessageTooLargeError(InvalidMessageError):
    """An encoded message is larger than ``BusSettings.max_message_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class UnknownMessageError(BusError, ValueError):
    """Ack of ids that are not pending for the queue's consumers.

    The ids that *were* pending have been acknowledged when this is raised; ``ids``
    lists only the unknown ones (never delivered, already acked, or never issued).
    """

    def __init__(self, queue: str, ids: Sequence[int]) -> None:
        shown = ", ".join(str(i) for i in ids[:10]) + (", ..." if len(ids) > 10 else "")
        super().__init__(f"queue {queue!r}: ids not pending: {shown}")
        self.queue = queue
        self.ids = tuple(ids)


class NotAttachedError(BusError):
    """The operation needs an attachment (or a connection) that is not there."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"{queue!r} is not attached")
        self.queue = queue


class QueueNotFoundError(BusError):
    """The queue does not exist in Redis: it expired, was closed, or was never created."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} does not exist (expired or closed)")
        self.queue = queue


class ModeConflictError(BusError):
    """A consumer's mode conflicts with the queue's current mode.

    A queue is either destructive (at-most-once and at-least-once consumers share it)
    or replay (non-destructive readers); the first consumer fixes the mode until the
    queue is closed or expires.
    """

    def __init__(self, queue: str, current: str, requested: str) -> None:
        super().__init__(
            f"queue {queue!r} is consumed in {current} mode; a {requested} consumer is refused"
        )
        self.queue = queue
        self.current = current
        self.requested = requested


class OrderingError(BusError):
    """An operation conflicts with a queue's ordering per key (see
    :meth:`busmq.Queue.set_ordering`): ordering needs at-least-once consumers, so it is
    refused on a replay queue, and at-most-once or replay consumers are refused on an
    ordered queue."""

    def __init__(self, queue: str, detail: str) -> None:
        super().__init__(f"queue {queue!r}: {detail}")
        self.queue = queue
        self.detail = detail


class QueueFullError(BusError):
    """A push would take the queue above its ``max_backlog``; nothing was stored."""

    def __init__(self, queue: str, limit: int) -> None:
        super().__init__(f"queue {queue!r} is full (max backlog {limit})")
        self.queue = queue
        self.limit = limit


class ProducerFencedError(BusError):
    """A sequenced push came from an older instance of its producer: a newer one (a
    higher epoch) has pushed to the queue since. Nothing was stored; the older instance
    should stop.

    Attributes:
        queue: the queue pushed to.
        producer: the producer's name.
        epoch: the epoch of the refused push.
        current_epoch: the epoch the queue holds for the producer.
    """

    def __init__(self, queue: str, producer: str, epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"producer {producer!r} epoch {epoch} is fenced on queue {queue!r} "
            f"(epoch {current_epoch} has pushed since)"
        )
        self.queue = queue
        self.producer = producer
        self.epoch = epoch
        self.current_epoch = current_epoch


class BusClosedError(BusError):
    """The bus, queue or consumer has been closed."""


class RedisCommandError(BusError):
    """Redis answered a command with an error busmq did not expect.

    This points at a misconfigured server (e.g. a Redis too old for streams) or a
    bug; the message is Redis's own.
    """


class ChannelStateError(BusError):
    """The channel is not in a state that allows the operation (e.g. ``send`` before
    ``connect``, or ``connect`` twice)."""

    def __init__(self, channel: str, message: str) -> None:
        super().__init__(f"channel {channel!r}: {message}")
        self.channel = channel


class ChannelEndedError(ChannelStateError):
    """The channel was ended, by this end or by the peer; it cannot be used again."""

    def __init__(self, channel: str, detail: str = "the channel has ended") -> None:
        super().__init__(channel, detail)


class ServiceError(BusError):
    """The service's handler raised while handling the request.

    Attributes:
        service: the service name.
        error_type: the class name of the handler's exception.
        detail: its message.
    """

    def __init__(self, service: str, error_type: str, detail: str) -> None:
        super().__init__(f"service {service!r} failed: {error_type}: {detail}")
        self.service = service
        self.error_type = error_type
        self.detail = detail


class RequestTimeoutError(BusError, TimeoutError):
    """No (further) reply came within the request's timeout.

    Attributes:
        service: the service name.
        correlation_id: the request's correlation id.
        timeout: the timeout in seconds.
    """

    def __init__(self, service: str, correlation_id: str, timeout: float) -> None:
        super().__init__(
            f"service {service!r}: no reply to request {correlation_id} within {timeout:g}s"
        )
        self.service = service
        self.correlation_id = correlation_id
        self.timeout = timeout


class BusUnavailableError(BusError):
    """Redis could not be reached; ``shard`` names the deployment (password masked).

    For a push, the outcome is unknown when this is raised after the command was sent:
    retry with the same ``request_id`` to make the retry idempotent (``request_id`` is
    set to it here, when the push had one).
    """

    def __init__(self, message: str, shard: str = "") -> None:
        super().__init__(f"{message} [{shard}]" if shard else message)
        self.shard = shard
        self.request_id: str | None = None


class BusTimeoutError(BusUnavailableError, TimeoutError):
    """An operation did not complete within ``BusSettings.operation_timeout``."""


class DurabilityError(BusError):
    """A push was applied by the master but not confirmed at the durability asked for
    (too few replicas acknowledged it, or the fsync was not confirmed) in time.

    The push *may* be stored, and may survive or be lost in a failover: retry it with
    the same ``request_id`` (deduped if the first one survived). ``ids`` are the ids
    the master gave it.
    """

    def __init__(self, message: str, shard: str = "", ids: Sequence[int] = ()) -> None:
        super().__init__(f"{message} [{shard}]" if shard else message)
        self.shard = shard
        self.ids = tuple(ids)


class DurabilityUnsupportedError(BusError):
    """The server cannot give the durability asked for (e.g. ``fsync`` on a Redis
    older than 7.2 that does not fsync every write); nothing was pushed."""


class TopologyError(BusError):
    """The Redis deployment is not what its URL says: a Sentinel service name that no
    Sentinel knows, for example."""


class EmbeddedRedisError(BusError):
    """The embedded redis-server could not be found, started, or stopped."""
