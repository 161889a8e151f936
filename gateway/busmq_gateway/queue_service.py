"""``busmq.v1.QueueService``: validates requests, calls the core, converts results."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from grpc_status import rpc_status

from busmq import (
    LATEST,
    Bus,
    BusError,
    Consumer,
    Mode,
    PushResult,
    QueueNotFoundError,
    Retention,
    UnknownMessageError,
    controls,
)
from busmq.controls import Settlement
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc as pb_grpc
from busmq.v1 import types_pb2

from .access import caller, check_owner
from .attachments import Attachments
from .config import GatewaySettings
from .controls import info_fields, producer_sequence, push_timing, rate_limit, retry_policy
from .convert import (
    check_push_many,
    consume_mode,
    delivery_fields,
    duration,
    outgoing_batch,
    seconds,
)
from .errors import (
    RequestError,
    error_status,
    failure_status,
    rpc_errors,
    unary,
)
from .fleet import CONSUMER, FleetKey
from .inventory_service import QueueInventory
from .push_stream import PushStreamSession, push_outcome
from .schema_service import QueueSchemas
from .streaming import Beat, StreamCount, paced_batches
from .throttle import ThrottledLog

log = logging.getLogger(__name__)
_throttled = ThrottledLog(log)


class QueueService(QueueInventory, QueueSchemas, pb_grpc.QueueServiceServicer):
    def __init__(
        self,
        bus: Bus,
        settings: GatewaySettings,
        attachments: Attachments,
        fleet: FleetKey,
        draining: asyncio.Event,
    ) -> None:
        self._bus = bus
        self._settings = settings
        self._attachments = attachments
        self._fleet = fleet
        self._draining = draining
        self._consumers: dict[str, Consumer] = {}  # by name: the streams this gateway serves
        self.no_streams = asyncio.Event()
        self.no_streams.set()
        self.browses = StreamCount()
        self.push_streams = StreamCount()

    @property
    def active_streams(self) -> int:
        return len(self._consumers)

    # -- attachments -------------------------------------------------------------------

    @unary
    async def AttachQueue(
        self, request: pb.AttachQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.AttachQueueResponse:
        ttl = seconds(request.ttl, "ttl") if request.HasField("ttl") else None
        retention = None
        if request.max_length or request.HasField("max_age"):
            max_age = seconds(request.max_age, "max_age") if request.HasField("max_age") else None
            retention = Retention(max_length=request.max_length or None, max_age=max_age)
        # max_backlog 0 keeps the current limit; remove_max_backlog asks for the core's
        # "0 removes it".
        backlog = request.max_backlog or None
        if request.remove_max_backlog:
            if backlog is not None:
                raise RequestError("max_backlog and remove_max_backlog are exclusive")
            backlog = 0
        attachment_id, created = await self._attachments.attach(
            request.queue, ttl or None, retention, backlog
        )
        return pb.AttachQueueResponse(
            attachment_id=attachment_id,
            created=created,
            lease_duration=duration(self._attachments.lease_seconds),
        )

    @unary
    async def RenewAttachment(
        self, request: pb.RenewAttachmentRequest, context: grpc.aio.ServicerContext
    ) -> pb.RenewAttachmentResponse:
        await self._attachments.renew(request.attachment_id)
        return pb.RenewAttachmentResponse()

    @unary
    async def DetachQueue(
        self, request: pb.DetachQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.DetachQueueResponse:
        await self._attachments.detach(request.attachment_id)
        return pb.DetachQueueResponse()

    # -- messages ------------------------------------------------------------------------

    @unary
    async def Push(
        self, request: pb.PushRequest, context: grpc.aio.ServicerContext
    ) -> pb.PushResponse:
        result = await self._push(request)
        return pb.PushResponse(ids=result.ids, duplicate=result.duplicate)

    async def _push(self, request: pb.PushRequest) -> PushResult:
        """One push, validated and stored (or deduped by its request_id): the whole of
        ``Push``, and each push of a ``PushMany``."""
        encoded = outgoing_batch(request.messages, self._bus.settings.max_message_bytes)
        queue = self._bus.queue(request.queue)
        return await queue.push_encoded(
            encoded,
            request_id=request.request_id or None,
            durability=request.durability or None,
            **push_timing(request),
            **producer_sequence(request),
        )

    @unary
    async def PushMany(
        self, request: pb.PushManyRequest, context: grpc.aio.ServicerContext
    ) -> pb.PushManyResponse:
        # One call instead of one per push: a unary call costs the gateway about a
        # millisecond of CPU whatever it carries, so coalescing clients need this to
        # reach thousands of single-message pushes a second.
        pushes = request.pushes
        check_push_many(pushes)
        outcomes: list[dict[str, Any]] = [{}] * len(pushes)
        by_queue: dict[str, list[int]] = {}
        for i, push in enumerate(pushes):
            by_queue.setdefault(push.queue, []).append(i)
        # A queue's pushes one after the other (its order); queues side by side, so that
        # the shard connections pipeline their commands.
        stop = request.stop_queue_at_failure
        runs = [self._push_in_order(pushes, ix, outcomes, stop) for ix in by_queue.values()]
        if len(runs) == 1:
            await runs[0]
        else:
            await asyncio.gather(*runs)
        return pb.PushManyResponse(outcomes=outcomes)

    async def _push_in_order(
        self,
        pushes: Sequence[pb.PushRequest],
        indexes: list[int],
        outcomes: list[dict[str, Any]],
        stop_at_failure: bool,
    ) -> None:
        """The pushes ``indexes`` (all to one queue) one after the other, each outcome
        as the fields of a ``PushOutcome``."""
        failed = False
        for i in indexes:
            if failed:
                outcomes[i] = {"error": error_status(_not_attempted(pushes[i].queue))}
                continue
            outcomes[i] = await push_outcome(self._push, pushes[i], "PushMany")
            failed = stop_at_failure and "error" in outcomes[i]

    async def PushStream(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PushStreamResponse]:
        session = PushStreamSession(self._push, self._draining)
        # Headers at once: a client may wait for them before its first write, and so
        # learn a refusal (sent before this) from its status, not from a failed write.
        await context.send_initial_metadata(())
        with self.push_streams.open():
            async with rpc_errors(context, "PushStream"):
                async for response in session.responses(requests):
                    yield response

    async def Consume(
        self, request: pb.ConsumeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ConsumeResponse]:
        consumer: Consumer | None = None
        async with rpc_errors(context, "Consume"):
            consumer = self._consumer_for(request)
            await consumer.start()
        if consumer is None:  # pragma: no cover - rpc_errors aborted the call
            return
        self._consumers[consumer.name] = consumer
        self.no_streams.clear()
        try:
            # The id names the consumer in Redis's group: any gateway settles by it.
            consumer_id = self._fleet.sign(
                CONSUMER, caller().name, consumer.queue.name, consumer.name
            )
            yield pb.ConsumeResponse(started=pb.ConsumeStarted(consumer_id=consumer_id))
            # A batch's lease is counted from here, after the write: a client counts
            # from when it reads `started`, later by the transit, not earlier.
            origin = time.monotonic()
            async for response in self._deliveries(consumer, context, request.batch, origin):
                yield response
        finally:
            self._consumers.pop(consumer.name, None)
            await self._end_consumer(consumer)
            if not self._consumers:
                self.no_streams.set()

    def _consumer_for(self, request: pb.ConsumeRequest) -> Consumer:
        mode = consume_mode(request.mode)
        prefetch = request.prefetch or self._settings.default_prefetch
        if prefetch > self._settings.max_prefetch:
            raise RequestError(f"prefetch must be at most {self._settings.max_prefetch}")
        visibility = 30.0
        if request.HasField("visibility_timeout"):
            visibility = seconds(request.visibility_timeout, "visibility_timeout")
        from_id = LATEST if request.from_latest else request.from_id
        if mode is not Mode.REPLAY and (request.from_id or request.from_latest):
            raise RequestError("from_id and from_latest apply to replay only")
        return self._bus.queue(request.queue).consume(
            mode,
            max=request.max or None,
            from_id=from_id if mode is Mode.REPLAY else LATEST,
            prefetch=prefetch,
            visibility_timeout=visibility,
            max_deliveries=request.max_deliveries or None,
            retry_policy=retry_policy(request),
        )

    async def _deliveries(
        self, consumer: Consumer, context: grpc.aio.ServicerContext, batch: bool, origin: float
    ) -> AsyncIterator[pb.ConsumeResponse]:
        beats = paced_batches(consumer, self._draining, self._settings.heartbeat_seconds)
        try:
            async for item in beats:
                if item is Beat.DRAINING:
                    yield _state("draining", consumer.queue.name)
                elif item is Beat.HEARTBEAT:
                    yield pb.ConsumeResponse(heartbeat=types_pb2.Heartbeat(time=_now()))
                elif batch:
                    fields: dict[str, Any] = {"deliveries": [delivery_fields(d) for d in item]}
                    lapses_at = consumer.lapses_at
                    if lapses_at is not None:
                        fields["lapses_after"] = duration(max(0.0, lapses_at - origin))
                    yield pb.ConsumeResponse(batch=fields)
                else:
                    for delivery in item:
                        yield pb.ConsumeResponse(delivery=delivery_fields(delivery))
        except BusError as exc:
            # Logged as rpc_errors logs (an unexpected one with its traceback).
            await context.abort_with_status(rpc_status.to_status(failure_status(exc, "Consume")))

    async def _end_consumer(self, consumer: Consumer) -> None:
        try:
            await consumer.close()
            if consumer.mode is Mode.AT_LEAST_ONCE:
                # The stream's reader is gone: whatever it was handed and did not ack is
                # redelivered promptly rather than after the visibility timeout. Not on
                # an ordered queue: a stream that broke or drained is not a client that
                # died, and its handlers may still run (docs/design.md, "Ordering per
                # key").
                released = await consumer.release_pending(unless_ordered=True)
                if released:
                    _throttled.log(
                        "released",
                        logging.INFO,
                        "released %d unacked deliveries of %s",
                        released,
                        consumer.queue.name,
                    )
        except BusError as exc:
            log.warning("closing consumer of %s: %s", consumer.queue.name, exc)

    @unary
    async def Ack(
        self, request: pb.AckRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckResponse:
        queue = self._bus.queue(request.queue)
        acked, unknown = 0, list[int]()
        if request.up_to_id:
            name = await self._consumer_of(request.queue, request.consumer_id)
            acked += await controls.ack_upto(queue.store, name, request.up_to_id)
        if request.ids:
            try:
                acked += await queue.ack(*request.ids)
            except UnknownMessageError as exc:
                unknown = list(exc.ids)
                acked += len(request.ids) - len(unknown)
        return pb.AckResponse(acked=acked, unknown_ids=unknown)

    @unary
    async def Nack(
        self, request: pb.NackRequest, context: grpc.aio.ServicerContext
    ) -> pb.NackResponse:
        delay = 0.0
        if request.HasField("delay"):
            delay = seconds(request.delay, "delay")
        if request.give_back:
            if delay or request.error:
                raise RequestError("give_back takes no delay or error: it is not a failure")
            settlement = Settlement(release=True)
        else:
            settlement = Settlement(delay=delay, error=request.error[:1024] or None)
        unknown = await self._settle(request.queue, request.consumer_id, request.ids, settlement)
        return pb.NackResponse(unknown_ids=unknown)

    @unary
    async def Reject(
        self, request: pb.RejectRequest, context: grpc.aio.ServicerContext
    ) -> pb.RejectResponse:
        settlement = Settlement(reject=True, error=request.reason[:1024] or None)
        unknown = await self._settle(request.queue, request.consumer_id, request.ids, settlement)
        return pb.RejectResponse(unknown_ids=unknown)

    async def _settle(
        self, queue: str, consumer_id: str, ids: Sequence[int], settlement: Settlement
    ) -> list[int]:
        """Settle through the stream's consumer; when another gateway (or worker) serves
        the stream, by the consumer's name in Redis's group, without its retry policy or
        max deliveries (the queue's apply)."""
        name = await self._consumer_of(queue, consumer_id)
        consumer = self._consumers.get(name)
        if consumer is not None:
            return await consumer.settle(list(ids), settlement)
        return await controls.settle(self._bus.queue(queue).store, name, list(ids), settlement)

    async def _consumer_of(self, queue: str, consumer_id: str) -> str:
        """The name of the consumer ``consumer_id`` names, once it is the caller's, of
        ``queue``, and reading it on some gateway of the fleet."""
        owner, of_queue, name = self._fleet.open(CONSUMER, consumer_id)
        check_owner(owner, "consumer_id")
        if of_queue != queue:
            raise RequestError("consumer_id belongs to another queue")
        if name not in self._consumers and not await controls.has_consumer(
            self._bus.queue(queue).store, name
        ):
            raise CONSUMER.not_found()
        return name

    # -- inspection and management -----------------------------------------------------

    @unary
    async def GetQueue(
        self, request: pb.GetQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetQueueResponse:
        queue = self._bus.queue(request.queue)
        info = await queue.info()  # counts, controls and ttl in one round trip
        return pb.GetQueueResponse(
            queue=queue.name,
            count=info.count,
            ttl=duration(info.ttl),
            last_id=info.last_id,
            metadata=await queue.metadata(),
            **info_fields(info),
        )

    @unary
    async def RequeueDead(
        self, request: pb.RequeueDeadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RequeueDeadResponse:
        queue = self._bus.queue(request.queue)
        ids = await queue.requeue_dead(list(request.ids) or None, limit=request.limit)
        return pb.RequeueDeadResponse(ids=ids)

    @unary
    async def UpdateQueueControls(
        self, request: pb.UpdateQueueControlsRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateQueueControlsResponse:
        queue = self._bus.queue(request.queue)
        if request.remove_rate_limits and request.HasField("rate_limit"):
            raise RequestError("give rate_limit or remove_rate_limits, not both")
        limit = rate_limit(request.rate_limit) if request.HasField("rate_limit") else None
        if request.HasField("paused"):
            await (queue.pause() if request.paused else queue.resume())
        if limit is not None or request.remove_rate_limits:
            await queue.set_rate_limit(limit)
        if request.HasField("max_deliveries"):
            await queue.set_max_deliveries(request.max_deliveries or None)
        if request.HasField("drop_expired"):
            await queue.drop_expired(request.drop_expired)
        if request.HasField("ordering_key"):
            try:
                await queue.set_ordering(request.ordering_key or None)
            except ValueError as exc:
                raise RequestError(str(exc)) from None
        return pb.UpdateQueueControlsResponse()

    @unary
    async def UpdateQueueMetadata(
        self, request: pb.UpdateQueueMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateQueueMetadataResponse:
        await self._bus.queue(request.queue).set_metadata(dict(request.metadata))
        return pb.UpdateQueueMetadataResponse()

    @unary
    async def FlushQueue(
        self, request: pb.FlushQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.FlushQueueResponse:
        await self._bus.queue(request.queue).flush()
        return pb.FlushQueueResponse()

    @unary
    async def CloseQueue(
        self, request: pb.CloseQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseQueueResponse:
        queue = self._bus.queue(request.queue)
        if not await queue.exists():
            raise QueueNotFoundError(request.queue)
        for consumer in [c for c in self._consumers.values() if c.queue.name == queue.name]:
            consumer.stop()
        await queue.close()
        return pb.CloseQueueResponse()


def _not_attempted(queue: str) -> RequestError:
    return RequestError(
        f"not attempted: an earlier push to {queue!r} in this call failed",
        "NOT_ATTEMPTED",
        grpc.StatusCode.ABORTED,
        {"queue": queue},
    )


def _now() -> timestamp_pb2.Timestamp:
    now = timestamp_pb2.Timestamp()
    now.GetCurrentTime()
    return now


def _state(kind: str, source: str) -> pb.ConsumeResponse:
    return pb.ConsumeResponse(state=types_pb2.StateEvent(kind=kind, source=source))
