"""Federation errors, and the translation of gRPC statuses back into busmq exceptions.

The gateway maps core errors to status codes with a ``google.rpc.ErrorInfo`` reason
(``busmq_gateway.errors.TABLE``); :func:`from_rpc_error` inverts that table, so a
federated object raises what the local one would:

    NOT_FOUND            QUEUE_NOT_FOUND  -> QueueNotFoundError
    INVALID_ARGUMENT     INVALID_NAME     -> InvalidNameError
                         INVALID_MESSAGE  -> InvalidMessageError
                         (other)          -> InvalidRequestError (a ValueError)
    FAILED_PRECONDITION  MODE_CONFLICT    -> ModeConflictError
                         NOT_PENDING      -> UnknownMessageError
                         NOT_ATTACHED     -> NotAttachedError
    RESOURCE_EXHAUSTED   QUEUE_FULL       -> QueueFullError
                         (other)          -> MessageTooLargeError
    UNAUTHENTICATED, PERMISSION_DENIED    -> FederationUnauthorizedError
    DEADLINE_EXCEEDED                     -> BusTimeoutError
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

import re

import grpc
from google.rpc import error_details_pb2
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
    QueueFullError,
    QueueNotFoundError,
    UnknownMessageError,
)

# Codes after which a call may be retried as is (AIP-194), and a push goes to the outbox.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
UNAUTHORIZED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
# A push that failed with one of these may or may not have been stored: it goes to the
# outbox and is resent with the same request_id (CANCELLED: the gateway or a proxy on
# the way cancelled the call, e.g. while overloaded or shutting down).
AMBIGUOUS = RETRYABLE | {grpc.StatusCode.CANCELLED}


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
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # an inconsistent rich status: ignore the details
        return ""
    if status is None:
        return ""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


def _ints(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def from_rpc_error(error: grpc.aio.AioRpcError, *, queue: str, target: str) -> BusError:
    """The busmq exception for a failed call on ``queue`` through ``target``."""
    code = error.code()
    message = error.details() or ""
    reason = error_reason(error)
    if code is grpc.StatusCode.NOT_FOUND and reason in ("QUEUE_NOT_FOUND", ""):
        return QueueNotFoundError(queue)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        if reason == "INVALID_NAME":
            return InvalidNameError(queue, message)
        if reason == "INVALID_MESSAGE":
            return InvalidMessageError(message)
        return InvalidRequestError(message)
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        return _precondition(reason, message, queue)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        numbers = _ints(message)
        if reason == "QUEUE_FULL":
            return QueueFullError(queue, numbers[-1] if numbers else 0)
        size, limit = (numbers[0], numbers[1]) if len(numbers) >= 2 else (0, 0)
        return MessageTooLargeError(size, limit)
    if code in UNAUTHORIZED:
        return FederationUnauthorizedError(target)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return BusTimeoutError(f"call on {queue!r} timed out: {message}", target)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return BusUnavailableError(f"gateway unavailable: {message}", target)
    return RemoteError(code.name, reason, message)


def _precondition(reason: str, message: str, queue: str) -> BusError:
    if reason == "MODE_CONFLICT":
        found = re.search(r"consumed in (\w+) mode; a (\w+) consumer", message)
        current, requested = found.groups() if found else ("?", "?")
        return ModeConflictError(queue, current, requested)
    if reason == "NOT_PENDING":
        return UnknownMessageError(queue, _ints(message.split(":", 1)[-1]))
    if reason == "NOT_ATTACHED":
        return NotAttachedError(queue)
    return RemoteError("FAILED_PRECONDITION", reason, message)
