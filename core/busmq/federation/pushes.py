"""The direct pushes of one link: over its ``PushStream`` while the gateway has one
(:mod:`busmq.federation.push_stream`), else coalesced into ``PushMany`` calls.

A unary gRPC call costs a gateway about a millisecond of CPU whatever it carries
(measured on a 2-core VM with a bare health ``Check``), so one gateway serves well under
a thousand single-message ``Push`` calls a second. The federated queues of a link
therefore push through one :class:`PushCoalescer`, Nagle-style with no added delay: a
push made while no call of it is under way is sent at once, as a ``Push``; pushes made
while one is wait, and go together in one ``PushMany`` as soon as it ends (at most
``MAX_PUSHES`` pushes, ``MAX_MESSAGES`` messages, about ``MAX_BYTES``). As in Nagle's
rule, a "full" call may go without waiting: once the waiting pushes hold ``FULL_MESSAGES``
messages or ``FULL_BYTES``, they are sent while fewer than ``max_in_flight`` calls are
under way, so producers of large batches keep the link busy. At a low rate nothing
waits; at a high rate of small pushes there is about one call per round trip, each
carrying every push made meanwhile (measured at 1,000 single pushes/s: ~300 calls/s,
and lower latency and CPU than two small calls under way).

Every push keeps its own outcome: the gateway stores each push of a ``PushMany`` as a
``Push`` (its own ``request_id`` dedupe; a queue's pushes in request order) and answers
each with its ids or with the status that ``Push`` would have ended with, mapped here
exactly as for a ``Push``. A failure of the whole call is the failure of each of its
pushes. ``UNAVAILABLE``, ``DEADLINE_EXCEEDED`` and ``CANCELLED`` (of the call or of one
push) raise :class:`AmbiguousPush`: the push may or may not be stored, and the caller
sends it to the outbox with its ``request_id``. A gateway that does not know
``PushMany`` (``UNIMPLEMENTED``) gets single ``Push`` calls from then on, until the link
is ready again after a break (the gateway may have been upgraded meanwhile); a call
refused as too large (``RESOURCE_EXHAUSTED``: the gateway's message size limit is below
``MAX_BYTES``) is sent again push by push.

Order: a queue's pushes made one after the other by one task keep their order (each
waits for its outcome before the next is made). Pushes made concurrently may go in
different calls, as concurrent ``Push`` calls would.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import grpc

from ..errors import BusError
from ..v1 import queue_service_pb2 as pb
from .calls import LinkCalls
from .errors import AMBIGUOUS, AmbiguousPush, from_rpc_error, from_status, status_code
from .push_stream import StreamedPushes, StreamUnsupported, settle

log = logging.getLogger(__name__)

MAX_PUSHES = 500  # pushes in one PushMany (the gateway accepts up to 10,000)
MAX_MESSAGES = 10_000  # messages in one PushMany: the gateway's bound
MAX_BYTES = 1024 * 1024  # a soft bound: one push alone may be larger
# Waiting pushes worth a call of their own while another is under way.
FULL_MESSAGES = 100
FULL_BYTES = 64 * 1024
CALLS_PER_CHANNEL = 1  # full calls under way per channel of the pool, at most
# Larger pushes go by calls: one over the gateway's gRPC message limit would end the
# whole stream (every push on it then ambiguous) where a call fails alone, and a large
# push would hold the stream's smaller ones behind it.
MAX_STREAMED_BYTES = MAX_BYTES


class _Waiting:
    __slots__ = ("future", "messages", "request", "size")

    def __init__(self, request: pb.PushRequest, future: asyncio.Future[pb.PushResponse]) -> None:
        self.request = request
        self.size = request.ByteSize()
        self.messages = len(request.messages)
        self.future = future


class PushCoalescer:
    """The direct pushes of one link (see the module docstring).

    Attributes:
        max_in_flight: calls under way on the link at most, when the waiting pushes
            are full (``CALLS_PER_CHANNEL`` per channel of the pool); otherwise one.
        push_many: whether waiting pushes go as one ``PushMany`` (False while the
            gateway answered ``UNIMPLEMENTED``).
    """

    def __init__(self, link: LinkCalls) -> None:
        self.max_in_flight = CALLS_PER_CHANNEL * link.target.pool_size
        self.push_many = True
        self._link = link
        self._in_flight = 0
        self._waiting: deque[_Waiting] = deque()
        self._waiting_messages = 0
        self._waiting_bytes = 0
        self._senders: set[asyncio.Task[None]] = set()
        self._closed = False
        self.streamed = StreamedPushes(link, self._push_error, self._call_error)
        """The link's ``PushStream``, the way pushes go while the gateway has it."""

    @property
    def waiting(self) -> int:
        """Pushes waiting for a call to end, to go together in the next one."""
        return len(self._waiting)

    async def push(self, request: pb.PushRequest) -> pb.PushResponse:
        """Store one push on the gateway; its ``PushResponse``.

        Raises:
            AmbiguousPush: it may or may not have been stored.
            BusError: the mapped refusal, as for a ``Push`` call.
        """
        if self._closed:
            raise BusError(f"the link to {self._link.url} is closed")
        if self.streamed.available and request.ByteSize() <= MAX_STREAMED_BYTES:
            try:
                return await self.streamed.push(request)
            except StreamUnsupported:
                pass  # not stored: by calls from now on
        if not self.push_many:
            return await self._push_one(request)
        if not self._in_flight:  # then nothing waits either
            self._in_flight += 1
            try:
                return await self._push_one(request)
            finally:
                self._ended()
        item = _Waiting(request, asyncio.get_running_loop().create_future())
        self._waiting.append(item)
        self._waiting_messages += item.messages
        self._waiting_bytes += item.size
        self._send_waiting()
        return await item.future

    def lacks_push_many(self) -> None:
        """The gateway answered ``PushMany`` with ``UNIMPLEMENTED`` (it predates it):
        single ``Push`` calls from now on (for the outbox's forwarder too)."""
        if self.push_many:
            log.info("gateway %s lacks PushMany: one Push call per push", self._link.url)
        self.push_many = False

    def retry_push_many(self) -> None:
        """The gateway may have changed (the link is ready again after a break): use
        ``PushStream`` and ``PushMany`` again if they were found missing."""
        self.push_many = True
        self.streamed.retry()

    async def close(self) -> None:
        """Cancel the pushes that wait and the calls under way (the link is closing)."""
        self._closed = True
        await self.streamed.close()
        while self._waiting:
            self._waiting.popleft().future.cancel()
        senders = tuple(self._senders)
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)

    # -- sending --------------------------------------------------------------------

    def _ended(self) -> None:
        """A call ended: send what waits."""
        self._in_flight -= 1
        self._send_waiting()

    def _send_waiting(self) -> None:
        """Send what waits while :meth:`_may_send` allows."""
        while self._may_send():
            batch = self._take()
            if not batch:
                break
            self._in_flight += 1
            task = asyncio.create_task(self._send(batch), name=f"busmq-pushes {self._link.url}")
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    def _may_send(self) -> bool:
        """Whether the waiting pushes go now: when no call is under way, or when they
        are full and fewer than ``max_in_flight`` calls are under way."""
        if not self._waiting or self._closed:
            return False
        if not self._in_flight:
            return True
        full = self._waiting_messages >= FULL_MESSAGES or self._waiting_bytes >= FULL_BYTES
        return full and self._in_flight < self.max_in_flight

    def _take(self) -> list[_Waiting]:
        """The oldest waiting pushes, within the bounds of one call (pushes whose caller
        gave up are dropped: they were never sent)."""
        batch: list[_Waiting] = []
        size = messages = 0
        waiting = self._waiting
        while waiting and len(batch) < MAX_PUSHES:
            item = waiting[0]
            if not item.future.done():
                if batch and (
                    size + item.size > MAX_BYTES or messages + item.messages > MAX_MESSAGES
                ):
                    break
                batch.append(item)
                size += item.size
                messages += item.messages
            waiting.popleft()
            self._waiting_messages -= item.messages
            self._waiting_bytes -= item.size
        return batch

    async def _send(self, batch: list[_Waiting]) -> None:
        try:
            if len(batch) > 1 and self.push_many:
                await self._send_many(batch)
            else:
                await self._send_each(batch)
        except asyncio.CancelledError:
            # The link is closing (a closed channel cancels its calls): the callers see
            # it as they would have seen it on their own call.
            for item in batch:
                item.future.cancel()
            raise
        except Exception as exc:  # not a call's status: a bug, which each caller sees
            log.exception("pushing to %s failed", self._link.url)
            for item in batch:
                _fail(item.future, exc)
        finally:
            self._ended()

    async def _send_each(self, batch: list[_Waiting]) -> None:
        await asyncio.gather(*(self._settle_one(item) for item in batch))

    async def _settle_one(self, item: _Waiting) -> None:
        try:
            response = await self._push_one(item.request)
        except (AmbiguousPush, BusError) as exc:
            _fail(item.future, exc)
        else:
            _resolve(item.future, response)

    async def _push_one(self, request: pb.PushRequest) -> pb.PushResponse:
        link = self._link
        try:
            response: pb.PushResponse = await link.stub().Push(
                request, metadata=link.metadata, timeout=link.operation_timeout
            )
        except grpc.aio.AioRpcError as exc:
            link.report(exc)
            raise self._call_error(request, exc) from None
        return response

    async def _send_many(self, batch: list[_Waiting]) -> None:
        link = self._link
        request = pb.PushManyRequest(pushes=[item.request for item in batch])
        try:
            response: Any = await link.stub().PushMany(
                request, metadata=link.metadata, timeout=link.operation_timeout
            )
        except grpc.aio.AioRpcError as exc:
            await self._call_failed(batch, exc)
            return
        outcomes = response.outcomes
        for index, item in enumerate(batch):
            outcome = outcomes[index] if index < len(outcomes) else None
            settle(item.future, item.request, outcome, self._push_error)

    async def _call_failed(self, batch: list[_Waiting], exc: grpc.aio.AioRpcError) -> None:
        code = exc.code()
        if code is grpc.StatusCode.UNIMPLEMENTED:
            self.lacks_push_many()
            await self._send_each(batch)
        elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            # Too large together for the gateway's limit; each alone gets its own answer.
            await self._send_each(batch)
        else:
            self._link.report(exc)
            for item in batch:
                _fail(item.future, self._call_error(item.request, exc))

    def _call_error(self, request: pb.PushRequest, exc: grpc.aio.AioRpcError) -> Exception:
        if exc.code() in AMBIGUOUS:
            return AmbiguousPush()
        return from_rpc_error(exc, queue=request.queue, target=self._link.url)

    def _push_error(self, request: pb.PushRequest, status: Any) -> Exception:
        code = status_code(status)
        self._link.report_code(code)
        if code in AMBIGUOUS:
            return AmbiguousPush()
        return from_status(status, queue=request.queue, target=self._link.url)


def _resolve(future: asyncio.Future[pb.PushResponse], response: pb.PushResponse) -> None:
    if not future.done():
        future.set_result(response)


def _fail(future: asyncio.Future[pb.PushResponse], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
