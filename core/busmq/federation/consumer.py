"""Federated consumers: a remote queue's ``Consume`` stream that survives link breaks.

A :class:`FederatedConsumer` behaves like :class:`busmq.Consumer` (an async iterator of
:class:`busmq.Delivery` and an async context manager, with ``ack``/``nack``), but reads
a server-streaming ``Consume`` call. When the stream breaks (network cut, gateway
restart or drain) it is reopened with backoff as soon as the link is usable again:

* **at-least-once**: the stream is simply reopened. The gateway gives the broken
  stream's unacked deliveries back at once (after a gateway crash: after the
  visibility timeout), and they come again with a higher ``delivery_count``. Deliveries
  that were buffered here but not yet handed out are dropped for that reason. Acks are
  by id, so a delivery received on a stream that broke can still be acked.
* **replay**: reopened with ``from_id`` = the last id received + 1: no duplicate, no
  gap (unless retention trimmed the history in between).
* **at-most-once**: reopened. Precisely, across any number of breaks:

  - no message is delivered twice, and ids are strictly increasing (push order);
  - deliveries that had reached this process are kept: those still buffered here are
    handed out after the break, before the resumed stream's;
  - the only messages lost are the last ones the broken stream had taken from Redis
    (at-most-once reads remove them) and not yet delivered here: those in the
    gateway's memory (at most ``3 * prefetch``: a batch being written, one in the
    hand-over slot, one just read) and those on the wire (HTTP/2 flow-control windows
    and socket buffers, which bound bytes, not messages). They are a contiguous run of
    ids right after the last one received before the break;
  - every message the broken stream had not taken is delivered: those still in Redis
    at the break, pushed during the outage, or pushed after the resume.

  The last point assumes the gateway noticed the break, which it does at once when
  the connection is reset or closed. If the connection dies silently, the gateway's
  stale stream keeps reading until its writes block on the flow-control window or
  its keepalive gives up (``keepalive_seconds`` + 20 s); what it reads meanwhile,
  even after the resume, is lost too, within the same bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from ..acks import AckBatcher
from ..consuming import LATEST, Mode, check_consume_arguments, handle_each
from ..controls import RetryPolicy, Settlement
from ..errors import (
    BusClosedError,
    BusError,
    UnknownMessageError,
)
from ..events import Event
from ..message import Delivery
from ..v1 import queue_service_pb2 as pb
from ..wire import MODE_TO_PROTO
from .backoff import Backoff
from .convert import Control, Settle, delivery, duration
from .errors import FederationUnauthorizedError, error_reason
from .link import LinkState
from .streams import StreamBroken, first_response, read

if TYPE_CHECKING:
    from .queue import FederatedQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _End:
    error: BaseException | None = None


class FederatedConsumer:
    """A resumable consumer of a federated queue; see the module docstring.

    Create with :meth:`FederatedQueue.consume`. ``name`` is the gateway's consumer id of
    the current stream (it changes when the stream is reopened); ``reconnects`` counts
    the reopenings.
    """

    def __init__(
        self,
        queue: FederatedQueue,
        mode: Mode,
        *,
        max: int | None,
        from_id: int,
        prefetch: int,
        visibility_timeout: float,
        max_deliveries: int | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        # The gateway enforces its own maximum prefetch (1000 by default).
        check_consume_arguments(
            mode,
            max=max,
            from_id=from_id,
            prefetch=prefetch,
            visibility_timeout=visibility_timeout,
            max_deliveries=max_deliveries,
            retry_policy=retry_policy,
        )
        self.queue = queue
        self.mode = mode
        self.max = max
        self.prefetch = prefetch
        self.visibility_timeout = visibility_timeout
        self.max_deliveries = max_deliveries
        self.retry_policy = retry_policy
        self.name = ""
        self.delivered = 0
        self.reconnects = 0
        self._from_id = from_id
        self._next_id = 0  # replay: the next id to ask for
        self._received = 0
        self._buffer: asyncio.Queue[Delivery | _End] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False
        self._finished = False
        self._acks = AckBatcher(queue.name, queue._ack_ids)

    def __repr__(self) -> str:
        return f"<FederatedConsumer {self.queue.name!r} {self.mode.value} {self.name or '-'}>"

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Open the stream (done by ``async with`` or iteration).

        Refusals (unknown queue, mode conflict, bad arguments, wrong credentials) raise
        here. If the link is down, the consumer starts anyway and opens its stream when
        the link returns.
        """
        if self._reader is not None:
            return
        if self._stopping:
            raise BusClosedError("consumer was stopped")
        self.queue._require_open()
        if self.mode is Mode.REPLAY:
            if self._from_id == LATEST:
                self._next_id = await self.queue.last_id() + 1
            else:
                self._next_id = max(self._from_id, 1)
        call = None
        try:
            call = await self._open()
        except StreamBroken as broken:
            if isinstance(broken.error, FederationUnauthorizedError):
                raise broken.error from None
            self._report(broken.error)
        self.queue._consumers.add(self)
        self._reader = asyncio.create_task(
            self._read_loop(call), name=f"busmq-federated-consumer {self.queue.name}"
        )
        details = {"mode": self.mode.value, "consumer": self.name}
        self.queue.events.emit(Event("consuming", self.queue.name, details=details))

    def stop(self) -> None:
        """End the stream now; iteration ends after the deliveries already received
        (at-least-once: those are dropped instead, the gateway redelivers them)."""
        if self._stopping:
            return
        self._stopping = True
        if self.mode is Mode.AT_LEAST_ONCE:
            self._discard_buffered()
        if self._reader is not None:
            self._reader.cancel()

    async def close(self) -> None:
        """Stop at once. At-most-once deliveries received but not handed out are lost
        (a ``dropped`` event counts them); at-least-once ones are redelivered."""
        self.stop()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        leftovers = self._discard_buffered()
        self._finished = True
        self._buffer.put_nowait(_End())  # wakes an iteration blocked in another task
        await self._acks.drain()
        if leftovers and self.mode is Mode.AT_MOST_ONCE:
            self.queue.events.emit(Event("dropped", self.queue.name, details={"count": leftovers}))
        if self in self.queue._consumers:
            self.queue._consumers.discard(self)
            details = {"consumer": self.name}
            self.queue.events.emit(Event("stopped", self.queue.name, details=details))

    async def __aenter__(self) -> FederatedConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- iteration ------------------------------------------------------------------

    def __aiter__(self) -> FederatedConsumer:
        return self

    async def __anext__(self) -> Delivery:
        if self._finished:
            raise StopAsyncIteration
        if self._reader is None:
            await self.start()
        item = await self._buffer.get()
        if isinstance(item, _End):
            self._finished = True
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        if self._buffer.qsize() < self.prefetch:
            self._room.set()
        self.delivered += 1
        self.queue._note_delivered(item)
        return item

    async def run(self, handler: Callable[[Delivery], Awaitable[Any]]) -> None:
        """Call ``handler`` for every delivery until stopped; at-least-once deliveries
        are acked when it returns and nacked when it raises."""
        async with self:
            await handle_each(self, handler, self.queue.name)

    # -- acknowledgements -----------------------------------------------------------

    async def ack(self, ids: Sequence[int]) -> int:
        """Acknowledge deliveries by id; see :meth:`FederatedQueue.ack`."""
        return await self.queue.ack(*ids)

    async def ack_upto(self, message_id: int) -> int:
        """Acknowledge this consumer's pending deliveries up to ``message_id`` on the
        current stream (those of a stream that broke were given back already)."""
        self._require_acks()
        request = pb.AckRequest(queue=self.queue.name, up_to_id=message_id, consumer_id=self.name)
        response = await self.queue._call("Ack", request)
        return int(response.acked)

    async def nack(self, ids: Sequence[int]) -> None:
        """Give deliveries of the current stream back for prompt redelivery."""
        self._require_acks()
        await self._nack(self.name, ids)

    async def _nack(self, consumer_id: str, ids: Sequence[int]) -> None:
        request = pb.NackRequest(queue=self.queue.name, consumer_id=consumer_id, ids=list(ids))
        try:
            await self.queue._call("Nack", request, raw=True)
        except grpc.aio.AioRpcError as exc:
            # The stream that received them ended: the gateway has given them back.
            if error_reason(exc) == "CONSUMER_NOT_FOUND":
                return
            raise self.queue._error(exc) from None

    def _require_acks(self) -> None:
        if self.mode is not Mode.AT_LEAST_ONCE:
            raise BusError(f"acks apply to at-least-once consumers, not {self.mode.value}")

    def _settler(self, consumer_id: str) -> Settle:
        async def settle(message_id: int, ack: bool) -> None:
            if ack:
                await self._acks.ack(message_id)
            else:
                await self._nack(consumer_id, [message_id])

        return settle

    def _controller(self, consumer_id: str) -> Control:
        """Nack with a delay or an error, and reject, through the stream's consumer."""

        async def control(message_id: int, settlement: Settlement) -> None:
            if settlement.reject:
                method = "Reject"
                request: Any = pb.RejectRequest(
                    queue=self.queue.name,
                    consumer_id=consumer_id,
                    ids=[message_id],
                    reason=settlement.error or "",
                )
            else:
                method = "Nack"
                request = pb.NackRequest(
                    queue=self.queue.name,
                    consumer_id=consumer_id,
                    ids=[message_id],
                    error=settlement.error or "",
                )
                if settlement.delay > 0:
                    request.delay.CopyFrom(duration(settlement.delay))
            try:
                response = await self.queue._call(method, request, raw=True)
            except grpc.aio.AioRpcError as exc:
                # The stream that received it ended: the gateway has given it back.
                if error_reason(exc) == "CONSUMER_NOT_FOUND":
                    return
                raise self.queue._error(exc) from None
            if response.unknown_ids:
                raise UnknownMessageError(self.queue.name, [int(i) for i in response.unknown_ids])

        return control

    # -- the stream -----------------------------------------------------------------

    def _request(self) -> pb.ConsumeRequest:
        request = pb.ConsumeRequest(
            queue=self.queue.name,
            mode=MODE_TO_PROTO[self.mode],
            prefetch=self.prefetch,
            visibility_timeout=duration(self.visibility_timeout),
            batch=True,
        )
        if self.max is not None:
            request.max = self.max - self._received
        if self.mode is Mode.REPLAY:
            request.from_id = self._next_id
        if self.max_deliveries is not None:
            request.max_deliveries = self.max_deliveries
        policy = self.retry_policy
        if policy is not None:
            request.retry_policy.CopyFrom(
                pb.RetryPolicy(
                    initial=duration(policy.initial),
                    factor=policy.factor,
                    max_delay=duration(policy.max_delay),
                    jitter=policy.jitter,
                )
            )
        return request

    async def _open(self) -> Any:
        """Open a stream and wait for its ``started`` event; returns the call.

        Raises the mapped error for refusals, ``StreamBroken`` for what is retried."""
        link = self.queue.link
        call = link.stub().Consume(self._request(), metadata=link.metadata, wait_for_ready=True)
        first = await first_response(call, link, "the stream", self.queue._error)
        if first.WhichOneof("event") == "started":
            self.name = first.started.consumer_id
        return call

    def _report(self, error: BusError) -> None:
        log.info("stream of %s broke: %s", self.queue.name, error)
        self.queue.events.emit(Event("error", self.queue.name, error=error))

    async def _read_loop(self, call: Any) -> None:
        settings = self.queue.link.settings
        backoff = Backoff(settings.reconnect_backoff_initial, settings.reconnect_backoff_max)
        end = _End()
        try:
            while not self._stopping:
                if call is None:
                    call = await self._reopen(backoff)
                    if call is None:
                        continue
                try:
                    done = await self._pump(call)
                except StreamBroken as broken:
                    self._report(broken.error)
                    done = False
                finally:
                    call.cancel()  # ends the stream if still open (a no-op otherwise)
                    call = None
                if done:
                    break  # max reached
                self._after_break()
                if self.max is not None and self._received >= self.max:
                    # Everything asked for arrived before the break (the end of the
                    # stream did not): reopening would ask for max - received = 0,
                    # which the gateway reads as "no limit".
                    break
                await asyncio.sleep(backoff.next())
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except BusError as exc:
            end = _End(exc)
        finally:
            self._buffer.put_nowait(end)

    async def _reopen(self, backoff: Backoff) -> Any:
        link = self.queue.link
        if not await link.wait_usable():
            if link.state is LinkState.CLOSED:
                raise BusClosedError(f"the link to {link.url} is closed")
            return None
        try:
            call = await self._open()
        except StreamBroken as broken:
            self._report(broken.error)
            await asyncio.sleep(backoff.next())
            return None
        backoff.reset()
        self.reconnects += 1
        details: dict[str, Any] = {"mode": self.mode.value, "consumer": self.name}
        details["resumed"] = True
        if self.mode is Mode.REPLAY:
            details["from_id"] = self._next_id
        self.queue.events.emit(Event("consuming", self.queue.name, details=details))
        return call

    async def _pump(self, call: Any) -> bool:
        """Move deliveries from the stream to the buffer; True when ``max`` is reached."""
        settle: Settle | None = None
        control: Control | None = None
        if self.mode is Mode.AT_LEAST_ONCE:
            settle, control = self._settler(self.name), self._controller(self.name)
        replay = self.mode is Mode.REPLAY
        while True:
            response = await read(call, self.queue.link, self.queue._error)
            if response is grpc.aio.EOF:
                # Ended by the gateway: max reached, draining, or the queue was closed
                # (reopening then tells which).
                return self.max is not None and self._received >= self.max
            event = response.WhichOneof("event")
            if event == "batch":
                received = response.batch.deliveries
            elif event == "delivery":
                received = [response.delivery]
            else:
                continue  # heartbeats, state events
            # The whole batch goes in before waiting for room (the buffer may hold up to
            # prefetch + one batch): a stop while waiting then loses none of it.
            for message in received:
                item = delivery(message, settle, control)
                self._received += 1
                if replay:
                    self._next_id = item.id + 1
                self._buffer.put_nowait(item)
            if self._buffer.qsize() >= self.prefetch:
                self._room.clear()
                await self._room.wait()

    def _after_break(self) -> None:
        if self.mode is Mode.AT_LEAST_ONCE:
            # The gateway gives a broken stream's unacked deliveries back: those not
            # handed out yet will come again, so do not hand them out twice.
            self._received -= self._discard_buffered()

    def _discard_buffered(self) -> int:
        dropped = 0
        kept: list[_End] = []
        while not self._buffer.empty():
            item = self._buffer.get_nowait()
            if isinstance(item, _End):
                kept.append(item)
            else:
                dropped += 1
        for item in kept:
            self._buffer.put_nowait(item)
        self._room.set()
        return dropped
