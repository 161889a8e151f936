"""What the resumable server streams of federation share (consumers, channel ends, Serve).

A stream is *broken* (:class:`StreamBroken`) when it failed in a way worth reopening
after: a transport failure, a gateway restart or drain, an internal error, or a refusal
of the credentials (the link then waits for a probe to succeed, which picks up a secret
rotated on the gateway). Anything else (an unknown queue, a bad argument) is a refusal
that ends the stream's owner with the mapped exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from ..errors import BusError, BusTimeoutError, BusUnavailableError
from .link import Link

RESUMABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
    }
)
"""Statuses after which a stream is reopened (with backoff)."""


class StreamBroken(Exception):
    """The stream could not be opened, or broke, in a way worth reopening after."""

    def __init__(self, error: BusError) -> None:
        super().__init__(str(error))
        self.error = error


def classify(link: Link, exc: grpc.aio.AioRpcError, error: BusError) -> Exception:
    """Report ``exc`` to the link; :class:`StreamBroken` wrapping ``error`` (the mapped
    exception) for a status worth reopening after, ``error`` itself otherwise."""
    link.report(exc)
    if exc.code() in RESUMABLE:
        return StreamBroken(error)
    return error


async def read(call: Any, link: Link, mapped: Callable[[grpc.aio.AioRpcError], BusError]) -> Any:
    """The next response of a stream (or ``grpc.aio.EOF``).

    Raises :func:`classify`'s outcome for a failed stream, and :class:`StreamBroken` when
    the call was cancelled under the reader: the link closed the stream's channel (it
    moved to another gateway URL). A cancellation of the reading task itself passes.
    """
    try:
        return await call.read()
    except grpc.aio.AioRpcError as exc:
        raise classify(link, exc, mapped(exc)) from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        closed = BusUnavailableError("the stream's channel was closed", link.url)
        raise StreamBroken(closed) from None


async def first_response(
    call: Any, link: Link, what: str, mapped: Callable[[grpc.aio.AioRpcError], BusError]
) -> Any:
    """The first response of a stream just opened, within the link's ``connect_timeout``
    (the call is cancelled if it does not come). Raises as :func:`read`, and
    :class:`StreamBroken` if the stream ends or times out before it started."""
    try:
        async with asyncio.timeout(link.settings.connect_timeout):
            first = await read(call, link, mapped)
    except TimeoutError:
        call.cancel()
        raise StreamBroken(BusTimeoutError(f"opening {what} timed out", link.url)) from None
    except BaseException:
        call.cancel()
        raise
    if first is grpc.aio.EOF:
        raise StreamBroken(BusUnavailableError(f"{what} ended before it started", link.url))
    return first
