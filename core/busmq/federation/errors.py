"""Federation errors, and the translation of gRPC statuses back into busmq exceptions.

The gateway maps core errors to status codes with a ``google.rpc.ErrorInfo`` reason
(``busmq_gateway.errors.TABLE``) and puts the error's facts (queue, limits, modes, ids)
in the ``ErrorInfo`` metadata; :func:`from_rpc_error` inverts that table and rebuilds
the exception from the metadata, never from the message, so a federated object raises
what the local one would, with the same attributes:

    NOT_FOUND            QUEUE_NOT_FOUND  -> QueueNotFoundError
    INVALID_ARGUMENT     INVALID_NAME     -> InvalidNameError
                         INVALID_MESSAGE  -> InvalidMessageError
                         (other)          -> InvalidRequestError (a ValueError)
    FAILED_PRECONDITION  MODE_CONFLICT    -> ModeConflictError
                         NOT_PENDING      -> UnknownMessageError
                         NOT_ATTACHED     -> NotAttachedError
                         PRODUCER_FENCED  -> ProducerFencedError
    RESOURCE_EXHAUSTED   QUEUE_FULL       -> QueueFullError
                         (other)          -> MessageTooLargeError
    UNAUTHENTICATED, PERMISSION_DENIED    -> FederationUnauthorizedError
    ABORTED              HANDLER_FAILED   -> ServiceError (error_type, service from metadata)
    DEADLINE_EXCEEDED    REQUEST_TIMEOUT  -> RequestTimeoutError
                         (other)          -> BusTimeoutError
    UNAVAILABLE, CANCELLED                -> BusUnavailableError
    anything else                         -> RemoteError

Federation adds two classes to the hierarchy (both under :class:`BusError`):

    BusError
    ├── OutboxFullError               the durable outbox is at its bound
    ├── OutboxLockedError             another process uses the outbox file
    ├── FederationUnauthorizedError   the gateway refused the secret (or certificate)
    ├── InvalidRequestError (ValueError) the gateway refused an argument (e.g. prefetch)
    └── RemoteError                   the gateway failed in a way busmq has no class for
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from ..errors import (
    BusError,
    BusTimeoutError,
    BusUnavailableError,
    InvalidMessageError,
    InvalidNameError,
    MessageTooLargeError,
    ModeConflictError,
    NotAttachedError,
    ProducerFencedError,
    QueueFullError,
    QueueNotFoundError,
    RequestTimeoutError,
    ServiceError,
    UnknownMessageError,
)
from ..schemas import (
    Compatibility,
    InvalidSchemaError,
    SchemaCompatibilityError,
    SchemaError,
    Violation,
)

# Codes after which a call may be retried as is (AIP-194), and a push goes to the outbox.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
UNAUTHORIZED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
# A push that failed with one of these may or may not have been stored: it goes to the
# outbox and is resent with the same request_id (CANCELLED: the gateway or a proxy on
# the way cancelled the call, e.g. while overloaded or shutting down).
AMBIGUOUS = RETRYABLE | {grpc.StatusCode.CANCELLED}


class AmbiguousPush(Exception):
    """The push may or may not have been stored (its call failed ``UNAVAILABLE``,
    ``DEADLINE_EXCEEDED`` or ``CANCELLED``, or its stream ended before its answer): send
    it to the outbox with its ``request_id``, which the gateway stores once."""


class OutboxFullError(BusError):
    """A push had to wait in the outbox, and the outbox is full (by message count or by
    the age of its oldest push). Nothing was stored; nothing already queued is lost.

    Attributes:
        target: the gateway URL.
        queue: the queue pushed to.
        reason: ``"max_messages"`` or ``"max_age"``.
    """

    def __init__(self, target: str, queue: str, reason: str, detail: str) -> None:
        super().__init__(f"outbox for {target} is full ({detail}); push to {queue!r} refused")
        self.target = target
        self.queue = queue
        self.reason = reason


class FederationUnauthorizedError(BusError):
    """The gateway refused this bus's credentials (``UNAUTHENTICATED``): fix the secret
    or client certificate. The link keeps retrying with backoff, so a rotated secret on
    the gateway side is picked up without a restart."""

    def __init__(self, target: str) -> None:
        super().__init__(f"gateway {target} refused the credentials")
        self.target = target


class InvalidRequestError(BusError, ValueError):
    """The gateway refused an argument of the request (``INVALID_ARGUMENT``), e.g. a
    ``prefetch`` above its limit; the message says which."""


class RemoteError(BusError):
    """The gateway answered with a status busmq has no specific class for.

    Attributes:
        code: the gRPC status code name (e.g. ``"INTERNAL"``).
        reason: the ``ErrorInfo`` reason, if any.
    """

    def __init__(self, code: str, reason: str, message: str) -> None:
        super().__init__(f"gateway error {code}{f' {reason}' if reason else ''}: {message}")
        self.code = code
        self.reason = reason


def error_reason(error: grpc.aio.AioRpcError) -> str:
    """The ``google.rpc.ErrorInfo`` reason carried by a failed call ("" if none)."""
    return error_info(error)[0]


def error_info(error: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
    """The ``google.rpc.ErrorInfo`` reason and metadata of a failed call (``("", {})``
    if it carries none)."""
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # an inconsistent rich status: ignore the details
        return "", {}
    if status is None:
        return "", {}
    return status_info(status)


def status_info(status: status_pb2.Status) -> tuple[str, dict[str, str]]:
    """The ``google.rpc.ErrorInfo`` reason and metadata of a status (``("", {})`` if it
    carries none)."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason), dict(info.metadata)
    return "", {}


def _int(metadata: dict[str, str], key: str) -> int:
    """An integer fact of the ``ErrorInfo`` metadata (0 if absent: an older gateway)."""
    try:
        return int(metadata.get(key, ""))
    except ValueError:
        return 0


def _ids(metadata: dict[str, str]) -> list[int]:
    return [int(i) for i in metadata.get("ids", "").split(",") if i.strip().isdigit()]


def status_code(status: status_pb2.Status) -> grpc.StatusCode:
    """The gRPC code of a ``google.rpc.Status`` (``UNKNOWN`` for a code gRPC lacks)."""
    return _CODES.get(status.code, grpc.StatusCode.UNKNOWN)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def from_rpc_error(error: grpc.aio.AioRpcError, *, queue: str, target: str) -> BusError:
    """The busmq exception for a failed call on ``queue`` through ``target``."""
    reason, metadata = error_info(error)
    failure = _from_failure(error.code(), error.details() or "", reason, metadata, queue, target)
    if reason.startswith("SCHEMA"):
        try:
            status = rpc_status.from_call(error)
        except ValueError:
            status = None
        if status is not None:
            return schema_failure(failure, status)
    return failure


def from_status(status: status_pb2.Status, *, queue: str, target: str) -> BusError:
    """The busmq exception for a failed push of a ``PushMany`` (its ``google.rpc.Status``
    is what the call of a single ``Push`` would have ended with)."""
    reason, metadata = status_info(status)
    failure = _from_failure(status_code(status), status.message, reason, metadata, queue, target)
    return schema_failure(failure, status)


def schema_failure(failure: BusError, status: status_pb2.Status) -> BusError:
    """``failure`` with the problems of a schema refusal filled in from the status's
    ``google.rpc.BadRequest`` (each field violation: ``messages[<index>]<pointer>``)."""
    found = error_details_pb2.BadRequest()
    if not any(d.Unpack(found) for d in status.details if d.Is(found.DESCRIPTOR)):
        return failure
    if isinstance(failure, SchemaError):
        problems = []
        for v in found.field_violations:
            index, _, pointer = v.field.removeprefix("messages[").partition("]")
            message = v.description.removeprefix(f"{v.reason}: ")
            problems.append(Violation(int(index or 0), pointer, v.reason, message))
        return SchemaError(failure.queue, failure.version, problems)
    if isinstance(failure, SchemaCompatibilityError):
        breaks = [v.description for v in found.field_violations]
        return SchemaCompatibilityError(failure.queue, failure.mode, failure.against, breaks)
    return failure


def _from_failure(
    code: grpc.StatusCode,
    message: str,
    reason: str,
    metadata: dict[str, str],
    queue: str,
    target: str,
) -> BusError:
    """The busmq exception for a status code, message and ``ErrorInfo`` (see the module
    docstring for the table)."""
    queue = metadata.get("queue") or queue
    if code is grpc.StatusCode.NOT_FOUND and reason in ("QUEUE_NOT_FOUND", ""):
        return QueueNotFoundError(queue)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        if reason == "INVALID_NAME":
            return InvalidNameError(
                metadata.get("name") or queue, metadata.get("detail") or message
            )
        if reason == "INVALID_MESSAGE":
            return InvalidMessageError(message)
        return _invalid(reason, metadata, message, queue)
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        return _precondition(reason, metadata, message, queue)
    return _from_other(code, reason, metadata, message, queue, target)


def _invalid(reason: str, metadata: dict[str, str], message: str, queue: str) -> BusError:
    if reason == "SCHEMA":  # its violations: schema_failure, from the BadRequest
        return SchemaError(queue, _int(metadata, "schema_version"), [])
    if reason == "SCHEMA_INCOMPATIBLE":
        mode = metadata.get("compatibility") or "BACKWARD"
        return SchemaCompatibilityError(queue, Compatibility(mode), _int(metadata, "against"), [])
    if reason == "INVALID_SCHEMA":
        return InvalidSchemaError(message)
    return InvalidRequestError(message)


def _from_other(
    code: grpc.StatusCode,
    reason: str,
    metadata: dict[str, str],
    message: str,
    queue: str,
    target: str,
) -> BusError:
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        if reason == "QUEUE_FULL":
            return QueueFullError(queue, _int(metadata, "max_backlog"))
        return MessageTooLargeError(_int(metadata, "size"), _int(metadata, "limit"))
    if code in UNAUTHORIZED:
        return FederationUnauthorizedError(target)
    outcome = _request_outcome(code, reason, metadata, message, queue)
    if outcome is not None:
        return outcome
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return BusTimeoutError(f"call on {queue!r} timed out: {message}", target)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return BusUnavailableError(f"gateway unavailable: {message}", target)
    return RemoteError(code.name, reason, message)


def _precondition(reason: str, metadata: dict[str, str], message: str, queue: str) -> BusError:
    if reason == "MODE_CONFLICT":
        current = metadata.get("current_mode") or "?"
        return ModeConflictError(queue, current, metadata.get("requested_mode") or "?")
    if reason == "NOT_PENDING":
        return UnknownMessageError(queue, _ids(metadata))
    if reason == "NOT_ATTACHED":
        return NotAttachedError(queue)
    if reason == "PRODUCER_FENCED":
        producer = metadata.get("producer") or "?"
        epoch, newer = _int(metadata, "epoch"), _int(metadata, "current_epoch")
        return ProducerFencedError(queue, producer, epoch, newer)
    return RemoteError("FAILED_PRECONDITION", reason, message)


def _request_outcome(
    code: grpc.StatusCode, reason: str, metadata: dict[str, str], message: str, name: str
) -> BusError | None:
    """A request to a service that reached it and failed there (None: not such a status)."""
    if code is grpc.StatusCode.ABORTED and reason == "HANDLER_FAILED":
        return _service_error(metadata, name)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and reason == "REQUEST_TIMEOUT":
        return _request_timeout(metadata, name)
    return None


def _service_error(metadata: dict[str, str], name: str) -> ServiceError:
    service = metadata.get("service") or name
    return ServiceError(service, metadata.get("error_type") or "Error", metadata.get("detail", ""))


def _request_timeout(metadata: dict[str, str], name: str) -> RequestTimeoutError:
    service = metadata.get("service") or name
    correlation_id = metadata.get("correlation_id", "")
    try:
        timeout = float(metadata.get("timeout", "").removesuffix("s"))
    except ValueError:
        timeout = 0.0
    return RequestTimeoutError(service, correlation_id, timeout)
