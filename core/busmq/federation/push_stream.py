"""The direct pushes of one link over one ``PushStream`` call.

A stream message costs grpc.aio about a third of a unary call's CPU on each side, and a
push waits for no other push's call, so a federated queue's pushes go over one long-lived
``PushStream`` when the gateway has it (:class:`~busmq.federation.pushes.PushCoalescer`
falls back to coalesced unary calls when it does not).

* The stream is opened on first use, on a channel of the link's pool, and again after
  it ends or the pool moved to another URL (a failover).
* Pushes are written in the order they were made, by a writer task while there are
  pushes to write: an eager one (Python 3.12+), so that a push made while none is being
  written is on the stream in its caller's turn of the event loop, not a turn later.
  The gateway stores a queue's pushes in the order read, and answers each by its
  ``sequence``.
* An answer is mapped exactly as a ``Push``'s status would be. A stream that ends
  (cut, drained, reset) leaves its unanswered pushes :class:`AmbiguousPush`: they may or
  may not be stored, and go to the outbox with their ``request_id``, which the gateway
  stores once. A push unanswered for ``operation_timeout`` does the same, and ends the
  stream (the next push opens another).
* Pushes over ``pushes.MAX_STREAMED_BYTES`` go by calls instead (see there).
* ``UNIMPLEMENTED`` (a gateway that predates ``PushStream``): nothing was stored; the
  unanswered pushes raise :class:`StreamUnsupported` and the link pushes by unary calls
  until it is ready again after a break.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

import grpc

from ..eager import start_eagerly
from ..v1 import queue_service_pb2 as pb
from .calls import LinkCalls
from .errors import UNAUTHORIZED, AmbiguousPush

log = logging.getLogger(__name__)


class StreamUnsupported(Exception):
    """The gateway has no ``PushStream``: the push was not stored; push it by a call."""


StatusError = Callable[[pb.PushRequest, Any], Exception]
"""The exception of a push answered with a ``google.rpc.Status``."""
CallError = Callable[[pb.PushRequest, grpc.aio.AioRpcError], Exception]
"""The exception of a push whose call (here: the stream) was refused."""


class _Stream:
    """One open ``PushStream`` call and what waits on it."""

    def __init__(self, link: LinkCalls) -> None:
        self.url = link.current_url
        self.call: Any = link.stub().PushStream(metadata=link.metadata)
        self.sequence = 0
        self.waiting: dict[int, tuple[pb.PushRequest, asyncio.Future[pb.PushResponse]]] = {}
        self.outgoing: collections.deque[pb.PushStreamRequest] = collections.deque()
        self.headers_read = False
        self.reader: asyncio.Task[None] | None = None
        self.writer: asyncio.Task[None] | None = None
        """Writes while there is something to write (see ``StreamedPushes._write``)."""
        self.writer_name = f"busmq-push-stream {self.url}"

    def tasks(self) -> list[asyncio.Task[None]]:
        return [task for task in (self.reader, self.writer) if task is not None]


def settle(
    future: asyncio.Future[pb.PushResponse],
    request: pb.PushRequest,
    outcome: Any,
    status_error: StatusError,
) -> None:
    """Resolve a push's ``future`` by its ``outcome`` (a ``PushOutcome`` of ``PushMany``
    or a ``PushStreamOutcome``; None if the gateway gave none): the ``PushResponse``,
    the mapped error, or :class:`AmbiguousPush` for a missing outcome (it may have been
    stored). A future already done (its caller gave up) is left alone."""
    if future.done():
        return
    kind = None if outcome is None else outcome.WhichOneof("outcome")
    if kind == "result":
        future.set_result(outcome.result)
    elif kind == "error":
        future.set_exception(status_error(request, outcome.error))
    else:
        future.set_exception(AmbiguousPush())


class StreamedPushes:
    """The link's ``PushStream`` (see the module docstring). ``available`` is False
    after the gateway answered ``UNIMPLEMENTED``, until :meth:`retry`."""

    def __init__(self, link: LinkCalls, status_error: StatusError, call_error: CallError) -> None:
        self.available = True
        self._link = link
        self._status_error = status_error
        self._call_error = call_error
        self._stream: _Stream | None = None

    async def push(self, request: pb.PushRequest) -> pb.PushResponse:
        """Store one push; its ``PushResponse``.

        Raises:
            AmbiguousPush: it may or may not have been stored.
            StreamUnsupported: the gateway has no ``PushStream`` (nothing was stored).
            BusError: the mapped refusal, as for a ``Push`` call.
        """
        stream = self._open()
        stream.sequence += 1
        sequence = stream.sequence
        future: asyncio.Future[pb.PushResponse] = asyncio.get_running_loop().create_future()
        stream.waiting[sequence] = (request, future)
        stream.outgoing.append(pb.PushStreamRequest(sequence=sequence, push=request))
        if stream.writer is None or stream.writer.done():
            stream.writer = start_eagerly(self._write(stream), name=stream.writer_name)
        try:
            async with asyncio.timeout(self._link.operation_timeout):
                return await future
        except TimeoutError:
            self._end(stream, AmbiguousPush())
            self._link.report_code(grpc.StatusCode.DEADLINE_EXCEEDED)
            raise AmbiguousPush() from None

    def retry(self) -> None:
        """The gateway may have changed (the link is ready again after a break)."""
        self.available = True

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            self._end(stream, asyncio.CancelledError())
            await asyncio.gather(*stream.tasks(), return_exceptions=True)

    # -- the call -----------------------------------------------------------------------

    def _open(self) -> _Stream:
        stream = self._stream
        if stream is not None and stream.url == self._link.current_url:
            return stream  # (an ended stream is no longer the current one)
        if stream is not None:
            self._end(stream, AmbiguousPush())
        stream = self._stream = _Stream(self._link)
        stream.reader = asyncio.create_task(
            self._read(stream), name=f"busmq-push-answers {stream.url}"
        )
        return stream

    async def _write(self, stream: _Stream) -> None:
        """Write what waits, then end (the next push starts another writer)."""
        call, outgoing = stream.call, stream.outgoing
        try:
            if not stream.headers_read:
                # The gateway's headers first: a refusal (UNIMPLEMENTED, UNAUTHENTICATED)
                # is then read as its status, not hidden by a write that lost the race
                # with it (grpc.aio reports such a write as INTERNAL: grpc/grpc#36066).
                await call.initial_metadata()
                stream.headers_read = True
            while outgoing and not call.done():
                await call.write(outgoing.popleft())
        except asyncio.CancelledError:
            raise
        except Exception:  # the call ended: the reader sees how
            pass

    async def _read(self, stream: _Stream) -> None:
        try:
            async for response in stream.call:
                for outcome in response.outcomes:
                    self._settle(stream, outcome)
            self._end(stream, AmbiguousPush())
        except grpc.aio.AioRpcError as exc:
            self._ended_with(stream, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # not a status: a bug, which the waiting pushes see
            log.exception("push stream to %s failed", stream.url)
            self._end(stream, exc)

    def _settle(self, stream: _Stream, outcome: Any) -> None:
        entry = stream.waiting.pop(outcome.sequence, None)
        if entry is not None:
            request, future = entry
            settle(future, request, outcome, self._status_error)

    def _ended_with(self, stream: _Stream, exc: grpc.aio.AioRpcError) -> None:
        """The stream ended with a status. Only ``UNIMPLEMENTED`` and a refused
        credential say that nothing was stored; any other end (a cut, a drain, or
        grpc.aio's ``INTERNAL`` for a write racing the server's end, grpc/grpc#36066)
        leaves the unanswered pushes ambiguous."""
        code = exc.code()
        if code is grpc.StatusCode.UNIMPLEMENTED:
            if self.available:
                log.info("gateway %s lacks PushStream: pushes go by calls", stream.url)
            self.available = False
            self._end(stream, StreamUnsupported())
        elif code in UNAUTHORIZED:
            self._link.report(exc)
            for request, future in stream.waiting.values():
                if not future.done():
                    future.set_exception(self._call_error(request, exc))
            self._end(stream, AmbiguousPush())
        else:
            self._link.report(exc)
            self._end(stream, AmbiguousPush())

    def _end(self, stream: _Stream, error: BaseException) -> None:
        """End ``stream``: every push still waiting on it fails with ``error``."""
        waiting, stream.waiting = stream.waiting, {}
        for _, future in waiting.values():
            if not future.done():
                if isinstance(error, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(error)
        current = asyncio.current_task()
        for task in stream.tasks():
            if task is not current:
                task.cancel()
        stream.call.cancel()
        if self._stream is stream:
            self._stream = None
