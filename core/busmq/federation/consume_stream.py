"""A remote queue's deliveries for a consumer: a ``Consume`` stream that survives link
breaks (the :class:`~busmq.consumer.ConsumerReader` of a federated queue).

When the stream breaks (network cut, gateway restart or drain) it is reopened with
backoff as soon as the link is usable again:

* **at-least-once**: the stream is simply reopened. The gateway gives the broken
  stream's unacked deliveries back at once (after a gateway crash: after the
  visibility timeout), and they come again with a higher ``delivery_count``; on an
  ordered queue it keeps them leased instead (their handlers may still run). Deliveries
  that were buffered here but not yet handed out are dropped the moment the stream
  ends, and given back once a stream reopens (``give_back``). Acks are by id, so a
  delivery received on a stream that broke can still be acked.
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
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import grpc

from ..consumer import Consumer
from ..consuming import LATEST, Mode
from ..controls import Settlement
from ..errors import BusClosedError, BusError, UnknownMessageError
from ..events import Event
from ..message import Delivery, ForwardTarget
from ..v1 import queue_service_pb2 as pb
from ..wire import MODE_TO_PROTO
from .backoff import Backoff
from .convert import Control, Settle, delivery, duration
from .errors import FederationUnauthorizedError, error_reason
from .link import Link, LinkState
from .streams import StreamBroken, first_response, read

log = logging.getLogger(__name__)


class RemoteQueue(Protocol):
    """What the reader needs of its queue's backend (a
    :class:`~busmq.federation.queue.RemoteQueueBackend`)."""

    link: Link

    def require_open(self) -> None: ...

    async def last_id(self) -> int: ...

    async def call(self, method: str, request: Any, *, raw: bool = False) -> Any: ...

    def error(self, exc: grpc.aio.AioRpcError) -> BusError: ...

    async def ack(self, ids: list[int]) -> list[int]: ...

    def note_delivered(self, item: Delivery) -> None: ...


class RemoteReader:
    """Reads a remote queue's ``Consume`` stream for one consumer (see the module
    docstring); the consumer's ``name`` is the gateway's consumer of the current
    stream."""

    stops_at_once = True

    def __init__(self, backend: RemoteQueue) -> None:
        self.backend = backend
        self.reconnects = 0
        self._next_id = 0  # replay: the next id to ask for
        self._received = 0
        self._call: Any = None  # the stream open() opened, for read()
        self._origin = 0.0  # when the current stream's `started` arrived
        # At-least-once: what a stream that ended had sent and this consumer dropped
        # unhanded, by the stream's consumer id: given back once a stream reopens.
        self._to_give_back: list[tuple[str, list[int]]] = []
        self._stream: Any = None  # the at-least-once stream whose end drops the read-ahead

    async def open(self, consumer: Consumer) -> dict[str, Any]:
        """Open the stream. Refusals (unknown queue, mode conflict, bad arguments, wrong
        credentials) raise; if the link is down, the consumer starts anyway and opens
        its stream when the link returns."""
        self.backend.require_open()
        if consumer.mode is Mode.REPLAY:
            if consumer.from_id == LATEST:
                self._next_id = await self.backend.last_id() + 1
            else:
                self._next_id = max(consumer.from_id, 1)
        try:
            self._call = await self._open(consumer)
        except StreamBroken as broken:
            if isinstance(broken.error, FederationUnauthorizedError):
                raise broken.error from None
            self._report(consumer, broken.error)
        return {"consumer": consumer.name}

    async def read(self, consumer: Consumer) -> None:
        link = self.backend.link
        backoff = Backoff(
            link.settings.reconnect_backoff_initial, link.settings.reconnect_backoff_max
        )
        call, self._call = self._call, None
        while not consumer.stopping:
            if call is None:
                call = await self._reopen(consumer, backoff)
                if call is None:
                    continue
            try:
                done = await self._pump(consumer, call)
            except StreamBroken as broken:
                self._report(consumer, broken.error)
                done = False
            finally:
                call.cancel()  # ends the stream if still open (a no-op otherwise)
                call = None
            if done:
                break  # max reached
            if consumer.mode is Mode.AT_LEAST_ONCE:
                self._drop_read_ahead(consumer, consumer.name)
            if consumer.max is not None and self._received >= consumer.max:
                # Everything asked for arrived before the break (the end of the stream
                # did not): reopening would ask for max - received = 0, which the
                # gateway reads as "no limit".
                break
            await asyncio.sleep(backoff.next())

    async def quiesce(self, consumer: Consumer) -> None:
        pass  # the stream is cancelled: the gateway gives back what it had sent

    async def finish(self, consumer: Consumer, leftovers: list[int]) -> None:
        last = consumer.last_handed_out()
        if last is not None:
            self.backend.note_delivered(last)
        if consumer.mode is Mode.AT_LEAST_ONCE and consumer.name:
            if leftovers:
                self._to_give_back.append((consumer.name, leftovers))
            if self._to_give_back and self.backend.link.state is LinkState.READY:
                await self._give_back(consumer.queue.name)

    def _ended(self, consumer: Consumer, consumer_id: str, call: Any) -> None:
        """A stream's done callback: its read-ahead is dropped, unless another stream
        has replaced it or it ended with every delivery asked for (``max``: all of them
        are handed out)."""
        if call is not self._stream:
            return
        self._stream = None
        if consumer.max is None or self._received < consumer.max:
            self._drop_read_ahead(consumer, consumer_id)

    def _drop_read_ahead(self, consumer: Consumer, consumer_id: str) -> None:
        """The stream of ``consumer_id`` ended: what it sent and this consumer has not
        handed out is dropped, to be given back. On a queue that is not ordered the
        gateway has given it back already, and it may be handed to another consumer;
        handed out here too, it would be handled twice. On an ordered queue it stays
        leased to the ended stream (its handlers may still run), and the give-back
        brings it out before its visibility timeout."""
        dropped, _ = consumer.take_read_ahead(keep_end=True)
        if dropped:
            self._received -= len(dropped)
            self._to_give_back.append((consumer_id, dropped))

    async def _give_back(self, queue: str) -> None:
        """Give back what ended streams sent and this consumer never handed out (only
        what is still pending for that stream's consumer: ``give_back``). Best effort:
        what could not be given back comes again when its visibility timeout lapses."""
        pending, self._to_give_back = self._to_give_back, []
        for consumer_id, ids in pending:
            request = pb.NackRequest(queue=queue, consumer_id=consumer_id, ids=ids, give_back=True)
            try:
                await self.backend.call("Nack", request, raw=True)
            except grpc.aio.AioRpcError as exc:
                if error_reason(exc) != "CONSUMER_NOT_FOUND":  # else: settled, or released
                    log.info("could not give back %d deliveries of %s: %s", len(ids), queue, exc)

    # -- the stream -----------------------------------------------------------------

    def _request(self, consumer: Consumer) -> pb.ConsumeRequest:
        request = pb.ConsumeRequest(
            queue=consumer.queue.name,
            mode=MODE_TO_PROTO[consumer.mode],
            prefetch=consumer.prefetch,
            visibility_timeout=duration(consumer.visibility_timeout),
            batch=True,
        )
        if consumer.max is not None:
            request.max = consumer.max - self._received
        if consumer.mode is Mode.REPLAY:
            request.from_id = self._next_id
        if consumer.max_deliveries is not None:
            request.max_deliveries = consumer.max_deliveries
        policy = consumer.retry_policy
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

    async def _open(self, consumer: Consumer) -> Any:
        """Open a stream and wait for its ``started`` event; returns the call.

        Raises the mapped error for refusals, ``StreamBroken`` for what is retried."""
        link = self.backend.link
        call = link.stub().Consume(
            self._request(consumer), metadata=link.metadata, wait_for_ready=True
        )
        first = await first_response(call, link, "the stream", self.backend.error)
        self._origin = time.monotonic()  # what the batches' lapses_after count from
        if first.WhichOneof("event") == "started":
            consumer.name = first.started.consumer_id
            if consumer.mode is Mode.AT_LEAST_ONCE:
                # Noticed at once, even while the pump waits for room to hand a batch
                # over (the iteration busy with a handler): the iteration must not hand
                # out what the ended stream sent (see _drop_read_ahead).
                self._stream = call
                call.add_done_callback(functools.partial(self._ended, consumer, consumer.name))
        return call

    def _report(self, consumer: Consumer, error: BusError) -> None:
        log.info("stream of %s broke: %s", consumer.queue.name, error)
        consumer.queue.events.emit(Event("error", consumer.queue.name, error=error))

    async def _reopen(self, consumer: Consumer, backoff: Backoff) -> Any:
        link = self.backend.link
        if not await link.wait_usable():
            if link.state is LinkState.CLOSED:
                raise BusClosedError(f"the link to {link.url} is closed")
            return None
        try:
            call = await self._open(consumer)
        except StreamBroken as broken:
            self._report(consumer, broken.error)
            await asyncio.sleep(backoff.next())
            return None
        backoff.reset()
        self.reconnects += 1
        if self._to_give_back:
            await self._give_back(consumer.queue.name)
        details: dict[str, Any] = {"mode": consumer.mode.value, "consumer": consumer.name}
        details["resumed"] = True
        if consumer.mode is Mode.REPLAY:
            details["from_id"] = self._next_id
        consumer.queue.events.emit(Event("consuming", consumer.queue.name, details=details))
        return call

    async def _pump(self, consumer: Consumer, call: Any) -> bool:
        """Hand the stream's batches over; True when ``max`` is reached."""
        settle: Settle | None = None
        control: Control | None = None
        if consumer.mode is Mode.AT_LEAST_ONCE:
            settle, control = self._settler(consumer), self._controller(consumer)
        replay = consumer.mode is Mode.REPLAY
        link, error = self.backend.link, self.backend.error
        while True:
            response = await read(call, link, error)
            if response is grpc.aio.EOF:
                # Ended by the gateway: max reached, draining, or the queue was closed
                # (reopening then tells which).
                return consumer.max is not None and self._received >= consumer.max
            event = response.WhichOneof("event")
            lapses_at: float | None = None
            if event == "batch":
                received = response.batch.deliveries
                if response.batch.HasField("lapses_after"):
                    lapses_at = self._origin + response.batch.lapses_after.ToMilliseconds() / 1000
            elif event == "delivery":
                received = [response.delivery]
            else:
                continue  # heartbeats, state events
            batch = [delivery(message, settle, control) for message in received]
            if not batch:
                continue
            self._received += len(batch)
            if replay:
                self._next_id = batch[-1].id + 1
            await consumer.hand_over(batch, lapses_at)

    # -- settling -------------------------------------------------------------------

    def _settler(self, consumer: Consumer) -> Settle:
        """A delivery's ack (batched) and nack, through the stream that received it."""
        consumer_id = consumer.name

        async def settle(message_id: int, ack: bool) -> None:
            if ack:
                await consumer.settle_one(message_id, True)
            else:
                await self._nack(consumer.queue.name, consumer_id, [message_id])

        return settle

    def _controller(self, consumer: Consumer) -> Control:
        """Nack with a delay or an error, and reject, through the stream's consumer."""
        consumer_id = consumer.name

        async def control(message_id: int, settlement: Settlement) -> None:
            await self._settle(consumer, consumer_id, [message_id], settlement, strict=True)

        return control

    async def flush_acks(self, consumer: Consumer, ids: list[int]) -> list[int]:
        return await self.backend.ack(ids)

    async def ack_upto(self, consumer: Consumer, message_id: int) -> int:
        request = pb.AckRequest(
            queue=consumer.queue.name, up_to_id=message_id, consumer_id=consumer.name
        )
        response = await self.backend.call("Ack", request)
        return int(response.acked)

    async def nack(self, consumer: Consumer, ids: Sequence[int]) -> None:
        """Give deliveries of the current stream back for prompt redelivery."""
        await self._nack(consumer.queue.name, consumer.name, ids)

    async def settle(
        self, consumer: Consumer, ids: Sequence[int], settlement: Settlement
    ) -> list[int]:
        return await self._settle(consumer, consumer.name, ids, settlement, strict=False)

    async def release_pending(self, consumer: Consumer, *, unless_ordered: bool) -> int:
        raise BusError("release_pending applies to local consumers (the gateway does it)")

    async def forward(
        self,
        consumer: Consumer,
        message_id: int,
        target: ForwardTarget,
        items: Sequence[Any],
        settle: bool,
    ) -> bool:
        raise BusError("forward applies to deliveries of local queues")

    async def _nack(self, queue: str, consumer_id: str, ids: Sequence[int]) -> None:
        request = pb.NackRequest(queue=queue, consumer_id=consumer_id, ids=list(ids))
        try:
            await self.backend.call("Nack", request, raw=True)
        except grpc.aio.AioRpcError as exc:
            # The stream that received them ended: the gateway has given them back.
            if error_reason(exc) == "CONSUMER_NOT_FOUND":
                return
            raise self.backend.error(exc) from None

    async def _settle(
        self,
        consumer: Consumer,
        consumer_id: str,
        ids: Sequence[int],
        settlement: Settlement,
        *,
        strict: bool,
    ) -> list[int]:
        """Nack (after a delay, with an error) or reject ``ids``; the ids that were not
        pending, raised as :class:`UnknownMessageError` with ``strict``."""
        queue = consumer.queue.name
        request: Any
        if settlement.reject:
            method = "Reject"
            request = pb.RejectRequest(
                queue=queue, consumer_id=consumer_id, ids=list(ids), reason=settlement.error or ""
            )
        else:
            method = "Nack"
            request = pb.NackRequest(
                queue=queue, consumer_id=consumer_id, ids=list(ids), error=settlement.error or ""
            )
            if settlement.delay > 0:
                request.delay.CopyFrom(duration(settlement.delay))
        try:
            response = await self.backend.call(method, request, raw=True)
        except grpc.aio.AioRpcError as exc:
            # The stream that received them ended: the gateway has given them back.
            if error_reason(exc) == "CONSUMER_NOT_FOUND":
                return []
            raise self.backend.error(exc) from None
        unknown = [int(i) for i in response.unknown_ids]
        if unknown and strict:
            raise UnknownMessageError(queue, unknown)
        return unknown
