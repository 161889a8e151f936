"""Server-streaming plumbing shared by servicers: heartbeats, the drain, open-stream counts."""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, TypeVar

from google.protobuf import timestamp_pb2

from busmq.consumer import Consumer
from busmq.message import Delivery

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


async def paced_batches(
    consumer: Consumer, draining: asyncio.Event, heartbeat_seconds: float
) -> AsyncGenerator[list[Delivery] | Beat, None]:
    """:func:`paced` for a consumer's batches, without a task per batch.

    ``paced`` awaits each item in a task of its own, to wait for it beside the drain and
    the heartbeat's timer: three turns of the event loop from a read's reply to the
    yield, each behind whatever else the gateway has to do then. Here the wait is
    :meth:`~busmq.Consumer.wait_ready`, which loses nothing when cancelled, so it runs
    under a timeout (the heartbeat) that the drain brings forward: one turn. Taking the
    batch (:meth:`~busmq.Consumer.next_batch`) is never cancelled: it may give back
    what was read ahead, which a cancellation could leave half done."""
    loop = asyncio.get_running_loop()
    waiting: asyncio.Timeout | None = None

    def drained(_: Any) -> None:
        if waiting is not None and not waiting.expired():
            waiting.reschedule(loop.time())

    drain = asyncio.ensure_future(draining.wait())
    drain.add_done_callback(drained)
    try:
        while not draining.is_set():
            try:
                async with asyncio.timeout(heartbeat_seconds) as waiting:
                    await consumer.wait_ready()
            except TimeoutError:
                if not draining.is_set():
                    yield Beat.HEARTBEAT
                continue
            except StopAsyncIteration:
                return
            finally:
                waiting = None
            try:
                batch = await consumer.next_batch()
            except StopAsyncIteration:
                return
            yield batch
        yield Beat.DRAINING
    finally:
        drain.cancel()


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
