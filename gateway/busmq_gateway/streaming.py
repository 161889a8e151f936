"""Server-streaming plumbing shared by servicers: heartbeats, the drain, open-stream counts."""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

from google.protobuf import timestamp_pb2

T = TypeVar("T")


class Beat(enum.Enum):
    """What :func:`paced` yields besides the source's items."""

    HEARTBEAT = "heartbeat"
    """The source was silent for ``heartbeat_seconds``."""
    DRAINING = "draining"
    """The gateway is draining: send a ``draining`` state and end the stream."""


async def paced(
    source: AsyncIterator[T], draining: asyncio.Event, heartbeat_seconds: float
) -> AsyncIterator[T | Beat]:
    """The items of ``source``, with a heartbeat after each silence of
    ``heartbeat_seconds``, until the source ends or the gateway drains (then one
    ``DRAINING`` and the end). Errors of the source propagate. The next item is awaited
    only after the previous one was taken, so a slow reader slows the source."""
    drain: asyncio.Future[Any] = asyncio.ensure_future(draining.wait())
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(source.__anext__())
            done, _ = await asyncio.wait(
                {pending, drain}, timeout=heartbeat_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            if drain in done:
                yield Beat.DRAINING
                return
            if pending not in done:
                yield Beat.HEARTBEAT
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        drain.cancel()
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


class StreamCount:
    """The open streams of a servicer, so that the drain can wait for them (the same
    attributes as ``QueueService``'s)."""

    def __init__(self) -> None:
        self.active_streams = 0
        self.no_streams = asyncio.Event()
        self.no_streams.set()

    @contextlib.contextmanager
    def open(self) -> Iterator[None]:
        self.active_streams += 1
        self.no_streams.clear()
        try:
            yield
        finally:
            self.active_streams -= 1
            if not self.active_streams:
                self.no_streams.set()


def now() -> timestamp_pb2.Timestamp:
    result = timestamp_pb2.Timestamp()
    result.GetCurrentTime()
    return result
