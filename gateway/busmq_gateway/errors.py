"""One table from core errors to gRPC status codes, with ``google.rpc.ErrorInfo`` details.

Servicers run their core calls inside :func:`rpc_errors`; anything not in the table is
logged and reported as ``INTERNAL`` with a generic message, so nothing about the
server leaks and the server keeps serving.

A request whose handler raised (``ServiceError``) is ``ABORTED``: the call reached a
handler and failed there, which a client must tell apart from its own mistakes
(``INVALID_ARGUMENT``) and from a channel in the wrong state (``FAILED_PRECONDITION``);
the handler's exception class is in the ``ErrorInfo`` metadata (``error_type``).

``ErrorInfo.metadata`` carries the facts of the error as strings, so that a client (the
federation client first of all) rebuilds the exception without parsing the message:

    reason              metadata keys
    INVALID_NAME        name, detail
    MESSAGE_TOO_LARGE   size, limit (bytes)
    QUEUE_FULL          queue, max_backlog
    PRODUCER_FENCED     queue, producer, epoch, current_epoch
    QUEUE_NOT_FOUND     queue
    NOT_ATTACHED        queue
    MODE_CONFLICT       queue, current_mode, requested_mode
    NOT_PENDING         queue, ids (comma-separated, at most MAX_METADATA_IDS), ids_total
    CHANNEL_*           channel
    HANDLER_FAILED      service, error_type, detail (the handler's message)
    REQUEST_TIMEOUT     service, correlation_id, timeout
    NOT_ATTEMPTED       queue (a push of a PushMany skipped after an earlier failure)
    DURABILITY_NOT_CONFIRMED  ids (comma-separated: stored, maybe not durably), shard
    SCHEMA              queue, schema_version, violations (how many; each in BadRequest)
    SCHEMA_INCOMPATIBLE queue, compatibility, against (the version; breaks in BadRequest)
    INVALID_SCHEMA      (none: the message says where the schema is wrong)

A schema refusal also carries a ``google.rpc.BadRequest`` (the second detail): a field
violation per problem, its field ``messages[<index>]<JSON pointer>`` and its reason the
JSON Schema keyword broken.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from busmq import errors as core
from busmq.schemas import InvalidSchemaError, SchemaCompatibilityError, SchemaError

from .throttle import ThrottledLog

log = logging.getLogger(__name__)
_throttled = ThrottledLog(log)
S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")

DOMAIN = "busmq.dev"
# Ids listed in a NOT_PENDING ErrorInfo: the status travels in a trailer, and gRPC
# refuses metadata above 8-16 KiB; ``ids_total`` says how many there were.
MAX_METADATA_IDS = 100

# Most specific first: the first matching class wins.
TABLE: tuple[tuple[type[BaseException], grpc.StatusCode, str], ...] = (
    (core.InvalidNameError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_NAME"),
    (core.MessageTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED, "MESSAGE_TOO_LARGE"),
    (SchemaError, grpc.StatusCode.INVALID_ARGUMENT, "SCHEMA"),
    (SchemaCompatibilityError, grpc.StatusCode.INVALID_ARGUMENT, "SCHEMA_INCOMPATIBLE"),
    (InvalidSchemaError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SCHEMA"),
    (core.InvalidMessageError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MESSAGE"),
    (core.QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL"),
    (core.QueueNotFoundError, grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND"),
    (core.NotAttachedError, grpc.StatusCode.FAILED_PRECONDITION, "NOT_ATTACHED"),
    (core.ProducerFencedError, grpc.StatusCode.FAILED_PRECONDITION, "PRODUCER_FENCED"),
    (core.ModeConflictError, grpc.StatusCode.FAILED_PRECONDITION, "MODE_CONFLICT"),
    (core.OrderingError, grpc.StatusCode.FAILED_PRECONDITION, "ORDERING"),
    (core.UnknownMessageError, grpc.StatusCode.FAILED_PRECONDITION, "NOT_PENDING"),
    (core.ChannelEndedError, grpc.StatusCode.FAILED_PRECONDITION, "CHANNEL_ENDED"),
    (core.ChannelStateError, grpc.StatusCode.FAILED_PRECONDITION, "CHANNEL_STATE"),
    (core.ServiceError, grpc.StatusCode.ABORTED, "HANDLER_FAILED"),
    (core.RequestTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED, "REQUEST_TIMEOUT"),
    (core.DurabilityError, grpc.StatusCode.UNAVAILABLE, "DURABILITY_NOT_CONFIRMED"),
    (
        core.DurabilityUnsupportedError,
        grpc.StatusCode.FAILED_PRECONDITION,
        "DURABILITY_UNSUPPORTED",
    ),
    (core.BusTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED, "REDIS_TIMEOUT"),
    (core.BusUnavailableError, grpc.StatusCode.UNAVAILABLE, "REDIS_UNAVAILABLE"),
    (core.BusClosedError, grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN"),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
)


class RequestError(Exception):
    """A bad request detected by the gateway itself (before reaching the core)."""

    def __init__(
        self,
        message: str,
        reason: str = "INVALID_ARGUMENT",
        code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})


class NotFound(RequestError):
    def __init__(self, message: str, reason: str, metadata: dict[str, str] | None = None) -> None:
        super().__init__(message, reason, grpc.StatusCode.NOT_FOUND, metadata)


def classify(exc: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """(status code, ErrorInfo reason, message safe to show the client)."""
    if isinstance(exc, RequestError):
        return exc.code, exc.reason, str(exc)
    for cls, code, reason in TABLE:
        if isinstance(exc, cls):
            return code, reason, str(exc)
    return grpc.StatusCode.INTERNAL, "INTERNAL", "internal error"


def error_metadata(exc: BaseException) -> dict[str, str]:
    """The ``ErrorInfo`` metadata of an error: what it happened to, and the numbers
    (see the module docstring for the keys)."""
    if isinstance(exc, RequestError):
        return dict(exc.metadata)
    if isinstance(exc, core.InvalidNameError):
        return {"name": exc.name, "detail": exc.reason}
    if isinstance(exc, core.MessageTooLargeError):
        return {"size": str(exc.size), "limit": str(exc.limit)}
    if isinstance(exc, core.QueueFullError | core.ProducerFencedError | core.DurabilityError):
        return _push_metadata(exc)
    if isinstance(exc, core.QueueNotFoundError | core.NotAttachedError):
        return {"queue": exc.queue}
    if isinstance(exc, core.OrderingError):
        return {"queue": exc.queue, "detail": exc.detail}
    if isinstance(exc, core.ModeConflictError):
        return {
            "queue": exc.queue,
            "current_mode": exc.current,
            "requested_mode": exc.requested,
        }
    if isinstance(exc, core.UnknownMessageError):
        ids = ",".join(str(i) for i in exc.ids[:MAX_METADATA_IDS])
        return {"queue": exc.queue, "ids": ids, "ids_total": str(len(exc.ids))}
    if isinstance(exc, core.ServiceError):
        return {"service": exc.service, "error_type": exc.error_type, "detail": exc.detail}
    if isinstance(exc, core.RequestTimeoutError):
        return {
            "service": exc.service,
            "correlation_id": exc.correlation_id,
            "timeout": f"{exc.timeout:g}s",
        }
    return _more_metadata(exc)


def _more_metadata(exc: BaseException) -> dict[str, str]:
    if isinstance(exc, core.ChannelStateError):
        return {"channel": exc.channel}
    if isinstance(exc, SchemaError):
        return {
            "queue": exc.queue,
            "schema_version": str(exc.version),
            "violations": str(len(exc.violations)),
        }
    if isinstance(exc, SchemaCompatibilityError):
        return {"queue": exc.queue, "compatibility": str(exc.mode), "against": str(exc.against)}
    return {}


def bad_request(exc: BaseException) -> error_details_pb2.BadRequest | None:
    """The ``BadRequest`` detail of a schema refusal: a field violation per problem, the
    field being ``messages[<index>]<JSON pointer>`` (or ``json_schema`` for a new version
    that breaks compatibility)."""
    if isinstance(exc, SchemaError):
        return error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=f"messages[{v.index}]{v.pointer}",
                    description=f"{v.rule}: {v.message}",
                    reason=v.rule,
                )
                for v in exc.violations
            ]
        )
    if isinstance(exc, SchemaCompatibilityError):
        return error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field="json_schema", description=text, reason="SCHEMA_INCOMPATIBLE"
                )
                for text in exc.breaks
            ]
        )
    return None


def _push_metadata(
    exc: core.QueueFullError | core.ProducerFencedError | core.DurabilityError,
) -> dict[str, str]:
    if isinstance(exc, core.QueueFullError):
        return {"queue": exc.queue, "max_backlog": str(exc.limit)}
    if isinstance(exc, core.ProducerFencedError):
        return {
            "queue": exc.queue,
            "producer": exc.producer,
            "epoch": str(exc.epoch),
            "current_epoch": str(exc.current_epoch),
        }
    return {"ids": ",".join(str(i) for i in exc.ids), "shard": exc.shard}


def error_status(exc: BaseException, metadata: dict[str, str] | None = None) -> status_pb2.Status:
    """The ``google.rpc.Status`` of an error: mapped code, safe message, ``ErrorInfo``."""
    code, reason, message = classify(exc)
    details = {**error_metadata(exc), **(metadata or {})}
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=details)
    detail = any_pb2.Any()
    detail.Pack(info)
    packed = [detail]
    violations = bad_request(exc)
    if violations is not None:
        packed.append(any_pb2.Any())
        packed[-1].Pack(violations)
    return status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=packed)


def to_status(exc: BaseException, metadata: dict[str, str] | None = None) -> grpc.Status:
    """:func:`error_status` as the status a call ends with."""
    return rpc_status.to_status(error_status(exc, metadata))


def failure_status(exc: Exception, method: str) -> status_pb2.Status:
    """The status that ``method`` reports for ``exc``, logged: a refusal briefly, an
    unexpected failure with its traceback (and only "internal error" for the client);
    either at most once a minute per method and kind (:mod:`busmq_gateway.throttle`).
    Shared by whole calls (:func:`rpc_errors`) and by the pushes of a ``PushMany``."""
    code, reason, _ = classify(exc)
    if code is grpc.StatusCode.INTERNAL:
        key = (method, type(exc).__name__)
        _throttled.log(key, logging.ERROR, "%s failed", method, exc_info=exc)
    else:
        _throttled.log(
            (method, reason), logging.INFO, "%s refused: %s %s", method, code.name, reason
        )
    return error_status(exc)


@asynccontextmanager
async def rpc_errors(context: grpc.aio.ServicerContext, method: str) -> AsyncIterator[None]:
    """Abort the call with the mapped status if the body raises. If the call already
    ended (the client cancelled, or its deadline passed while the body ran), there is
    nobody to tell: the call ends as cancelled, without the status grpc could not send
    (and would log with a traceback, once per such call)."""
    try:
        yield
    except Exception as exc:
        status = failure_status(exc, method)
        if context.done():
            raise asyncio.CancelledError from exc
        await context.abort_with_status(rpc_status.to_status(status))


def unary(
    method: Callable[[S, Req, grpc.aio.ServicerContext], Awaitable[Resp]],
) -> Callable[[S, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    """Decorate a unary servicer method so that errors become mapped statuses."""

    @functools.wraps(method)
    async def wrapper(self: S, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        async with rpc_errors(context, method.__name__):
            return await method(self, request, context)
        raise AssertionError("unreachable: rpc_errors aborts the call")

    return wrapper
