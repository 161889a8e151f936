"""Federated queues: a queue that lives behind a remote gateway, with the queue API.

``bus.federate(bus.queue("orders"), "https://gateway-a:8443")`` returns a
:class:`FederatedQueue`: the queue API of :class:`busmq.Queue`
(:class:`~busmq.queue_api.QueueAPI`, written once) over :class:`RemoteQueueBackend`,
with these differences:

* ``push`` / ``push_batch`` return ``None`` when the push went to the durable outbox
  (the link is not usable, the call failed ``UNAVAILABLE``, was cancelled or timed out
  so that it may or may not have been stored, or earlier pushes to the queue are still
  waiting there). ``None`` means "durably queued, will
  be forwarded in order"; the ids are assigned by the remote queue when it arrives.
  Every push carries a ``request_id`` (a random one if not given), so a retried push is
  stored once within the gateway's dedupe window.
* An attachment is a lease renewed through the gateway every ``lease_duration / 3``;
  if the gateway forgot it (it restarted, or the link was down past the lease) the
  queue is attached again (an ``attached`` event with ``reattached`` in its details).
* Consumers resume across link breaks; see :mod:`busmq.federation.consume_stream`.
* Link events are re-emitted on ``queue.events`` with the link URL as ``source``:
  ``ready``, ``unauthorized``, ``closed`` (the link, not the queue), ``error``,
  ``state`` and ``failover``. Queue events have the queue name as ``source``: ``attached``,
  ``detached``, ``consuming``, ``stopped``, ``closed`` (the remote queue was closed or
  expired), ``dropped``, ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import grpc

from ..consumer import Consumer
from ..consuming import Mode
from ..controls import RateLimit, due_ms, expires_ms
from ..durability import Durability
from ..errors import BusClosedError, BusError, QueueNotFoundError
from ..events import Event
from ..keys import validate_name
from ..message import Delivery, EncodedMessage, encode_item
from ..pushing import Item, PushOptions, PushResult
from ..queue_api import AttachOptions, Owner, QueueAPI
from ..schemas import SchemaError
from ..v1 import queue_service_pb2 as pb
from .backoff import Backoff
from .consume_stream import RemoteReader
from .convert import duration, outgoing, seconds
from .errors import AmbiguousPush, RemoteError, error_reason, from_rpc_error
from .link import Link, LinkState
from .linked import Linked
from .remote_schema import RemoteSchema

if TYPE_CHECKING:
    from .context import FederationContext

log = logging.getLogger(__name__)
Headers = Mapping[str, str]


REPEATED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
"""What :meth:`RemoteQueueBackend.repeated` repeats: the gateway went away in the call."""


@dataclass(frozen=True)
class ConsumerLag:
    """How far this process's consumers of a federated queue are behind.

    Attributes:
        messages: the remote queue's last id minus the last id delivered here (0 when
            caught up; the remote ``count`` when nothing was delivered yet).
        seconds: now minus the push time of the last message delivered here, when
            behind (0 when caught up).
        last_delivered_id: the last id delivered here, if any.
    """

    messages: int
    seconds: float
    last_delivered_id: int | None


class FederatedQueue(QueueAPI[None, Consumer], Linked):
    """A queue in another datacenter, used through its gateway (see the module docstring):
    the queue API of :class:`busmq.Queue` over :class:`RemoteQueueBackend`.

    Attributes:
        name: the queue name.
        link: the :class:`~busmq.federation.Link` to the gateway.
        events: queue and link events.
        pushed: messages this client stored remotely (directly or forwarded).
        consumed: messages this client's consumers handed out.
    """

    def __init__(self, manager: FederationContext, link: Link, name: str) -> None:
        super().__init__(validate_name(name))
        self.link = link
        self._manager = manager
        self.tracing = manager.bus.tracing
        self._backend = self._remote = RemoteQueueBackend(self, manager, link)

    def __repr__(self) -> str:
        return f"<FederatedQueue {self.name!r} via {self.link.url} attached={self.attached}>"

    @property
    def outbox_depth(self) -> int:
        """Messages pushed to this queue that wait in the outbox."""
        return self._manager.outbox.queue_depth(self.target, self.name)

    async def lag(self) -> ConsumerLag:
        """How far behind this process's consumers are (one ``GetQueue`` call)."""
        info = await self._remote.info()
        last = self._last_delivered()
        if info is None:
            return ConsumerLag(0, 0.0, None if last is None else last[0])
        if last is None:
            return ConsumerLag(int(info.count), 0.0, None)
        last_id, push_ms = last
        behind = max(0, int(info.last_id) - last_id)
        age = max(0.0, time.time() - push_ms / 1000) if behind else 0.0
        return ConsumerLag(behind, age, last_id)

    async def reattach(self) -> bool:
        """Attach again with the original arguments (the gateway forgot the
        attachment, or the queue expired while the link was down)."""
        return await self._remote.reattach()

    def _last_delivered(self) -> tuple[int, int] | None:
        """(id, push time ms) of the last message delivered here, if any."""
        for consumer in self._consumers:
            last = consumer.last_handed_out()
            if last is not None:
                self._remote.note_delivered(last)
        return self._remote.last_delivered

    def _on_link_event(self, event: Event) -> None:
        queue = event.details.get("queue")
        if queue is not None and queue != self.name:
            return
        if event.kind == "ready":
            self._remote.renew_now.set()  # renew at once: the lease may be close to lapsing
        self.events.emit(event)

    async def _release(self) -> None:
        await self.detach()

    async def _stop_local(self) -> None:
        for consumer in tuple(self._consumers):
            await consumer.close()
        await self._remote.stop_renewer()


class RemoteQueueBackend:
    """A queue behind a gateway: unary calls on the link, pushes through the link's push
    stream or the outbox, a lease renewed by a task of its own."""

    def __init__(self, queue: FederatedQueue, manager: FederationContext, link: Link) -> None:
        self._queue = Owner(queue)
        self.name = queue.name
        self._manager = manager
        self.link = link
        self.last_delivered: tuple[int, int] | None = None  # (id, push time ms) handed out
        self._attachment: str | None = None
        self._attach_request: pb.AttachQueueRequest | None = None
        self._lease = 0.0
        self._renewer: asyncio.Task[None] | None = None
        self.renew_now = asyncio.Event()
        self.schema = RemoteSchema(self.name)

    @property
    def attached(self) -> bool:
        return self._attachment is not None

    def require_open(self) -> None:
        if self._manager.closed:
            raise BusClosedError("federation is closed")

    # -- attachment -----------------------------------------------------------------

    async def attach(self, options: AttachOptions) -> bool:
        """``max_backlog=0`` removes the limit (``AttachQueueRequest.remove_max_backlog``;
        a gateway older than that field ignores it and keeps the limit)."""
        ttl, retention, max_backlog = options.ttl, options.retention, options.max_backlog
        request = pb.AttachQueueRequest(
            queue=self.name, max_backlog=max_backlog or 0, remove_max_backlog=max_backlog == 0
        )
        if ttl is not None:
            request.ttl.CopyFrom(duration(ttl))
        if retention is not None:
            request.max_length = retention.max_length or 0
            if retention.max_age:
                request.max_age.CopyFrom(duration(retention.max_age))
        created = await self._attach(request)
        if options.auto_renew:
            self._renewer = asyncio.create_task(
                self._renew_loop(), name=f"busmq-federated-renewal {self.name}"
            )
        return created

    async def _attach(self, request: pb.AttachQueueRequest) -> bool:
        response = await self.call("AttachQueue", request)
        self._attachment = str(response.attachment_id)
        self._attach_request = request
        self._lease = seconds(response.lease_duration) or 15.0
        self._manager.note_attached(self._queue(), self.name, True)
        await self.schema.refresh(self.call)
        return bool(response.created)

    async def release(self) -> None:
        await self.stop_renewer()
        attachment, self._attachment = self._attachment, None
        self._manager.note_attached(self._queue(), self.name, False)
        if attachment is None:
            return
        try:
            await self.call("DetachQueue", pb.DetachQueueRequest(attachment_id=attachment))
        except QueueNotFoundError:
            pass  # the gateway no longer had it: it is released either way
        except RemoteError as exc:
            # A gateway restarted since the attach knows nothing of it: nothing is left
            # to release (its lease lapses on its own).
            if exc.reason != "ATTACHMENT_NOT_FOUND":
                raise

    def forget(self) -> None:
        """The queue is gone (closed, or expired): no attachment is left to renew."""
        self._attachment = None
        self._manager.note_attached(self._queue(), self.name, False)

    async def renew(self) -> bool:
        assert self._attachment is not None
        request = pb.RenewAttachmentRequest(attachment_id=self._attachment)
        try:
            await self.call("RenewAttachment", request, raw=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.NOT_FOUND:
                raise self.error(exc) from None
            if error_reason(exc) == "ATTACHMENT_NOT_FOUND":
                return await self.reattach()
            return False
        return True

    async def reattach(self) -> bool:
        if self._attach_request is None or self._attachment is None:
            return False
        created = await self._attach(self._attach_request)
        details = {"created": created, "reattached": True}
        self._queue().events.emit(Event("attached", self.name, details=details))
        return True

    async def _renew_loop(self) -> None:
        waits = renewal_waits(lambda: self._lease / 3)
        while self._attachment is not None:
            self.renew_now.clear()
            try:
                async with asyncio.timeout(next(waits)):
                    await self.renew_now.wait()
            except TimeoutError:
                pass
            # The queue may have been closed, or dropped by its owner, during the wait.
            queue = self._queue.get()
            if queue is None or self._attachment is None:
                return
            try:
                await queue.renew()
            except BusError as exc:
                log.info("renewal of federated %s failed: %s", self.name, exc)
                queue.events.emit(Event("error", self.name, error=exc))
            del queue  # not held across the wait: its owner may drop it

    async def stop_renewer(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not asyncio.current_task():
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)

    # -- pushing and consuming ----------------------------------------------------------

    async def push_items(self, items: Iterable[Item], options: PushOptions) -> PushResult | None:
        limit = self._manager.bus.settings.max_message_bytes
        return await self.push_encoded([encode_item(item, limit) for item in items], options)

    async def push_encoded(
        self, encoded: Sequence[EncodedMessage], options: PushOptions
    ) -> PushResult | None:
        """A :class:`~busmq.PushResult`, or ``None`` if kept in the outbox."""
        self.require_open()
        if not encoded:
            return PushResult([], False)
        await self.schema.check([m.payload for m in encoded], self.call)  # before the outbox
        request = pb.PushRequest(
            queue=self.name,
            messages=outgoing(encoded),
            request_id=checked_request_id(options.request_id),
        )
        if options.durability is not None:
            request.durability = str(Durability.parse(options.durability))
        if options.sequenced is not None:
            producer = options.sequenced.producer
            request.producer, request.producer_epoch = producer.name, producer.epoch
            request.producer_sequence = options.sequenced.sequence
        set_timing(request, options.delay, options.at, options.ttl, options.expires_at)
        try:
            response = await push_or_queue(self._manager, self.link, request, len(encoded))
        except SchemaError:
            await self.schema.refresh(self.call)  # the version this process knew is old
            raise
        if response is None:
            return None
        return PushResult(list(response.ids), bool(response.duplicate))

    def consumer(self, mode: Mode, **options: Any) -> Consumer:
        return Consumer(self._queue(), mode, RemoteReader(self), **options)

    def note_delivered(self, item: Delivery) -> None:
        """A consumer handed ``item`` out (see :meth:`FederatedQueue.lag`)."""
        if self.last_delivered is None or item.id >= self.last_delivered[0]:
            self.last_delivered = (item.id, item.message.timestamp_ms)

    async def ack(self, ids: list[int]) -> list[int]:
        if not ids:
            return []
        response = await self.repeated("Ack", pb.AckRequest(queue=self.name, ids=ids))
        return [int(i) for i in response.unknown_ids]

    # -- inspection and management ------------------------------------------------

    async def info(self) -> Any:
        """The remote ``GetQueue`` answer, ``None`` if the queue does not exist."""
        try:
            return await self.call("GetQueue", pb.GetQueueRequest(queue=self.name))
        except QueueNotFoundError:
            return None

    async def count(self) -> int:
        info = await self.info()
        return 0 if info is None else int(info.count)

    async def exists(self) -> bool:
        return await self.info() is not None

    async def ttl(self) -> float | None:
        info = await self.info()
        return None if info is None else seconds(info.ttl)

    async def last_id(self) -> int:
        info = await self.info()
        return 0 if info is None else int(info.last_id)

    async def metadata(self) -> dict[str, str]:
        info = await self.info()
        return {} if info is None else dict(info.metadata)

    async def set_metadata(self, values: Mapping[str, str]) -> None:
        request = pb.UpdateQueueMetadataRequest(queue=self.name, metadata=dict(values))
        await self.call("UpdateQueueMetadata", request)

    async def flush(self) -> None:
        await self.call("FlushQueue", pb.FlushQueueRequest(queue=self.name))

    async def destroy(self) -> None:
        with contextlib.suppress(QueueNotFoundError):
            await self.call("CloseQueue", pb.CloseQueueRequest(queue=self.name))

    # -- processing controls (see busmq.controls) --------------------------------------

    async def set_paused(self, paused: bool) -> None:
        await self._controls(paused=paused)

    async def set_rate_limit(self, limit: RateLimit | None) -> None:
        if limit is None:
            await self._controls(remove_rate_limits=True)
            return
        await self._controls(
            rate_limit=pb.RateLimit(
                limit=limit.limit, per=duration(limit.per_seconds), key=limit.key or ""
            )
        )

    async def set_max_deliveries(self, max_deliveries: int | None) -> None:
        await self._controls(max_deliveries=max_deliveries or 0)

    async def set_drop_expired(self, drop: bool) -> None:
        await self._controls(drop_expired=drop)

    async def set_ordering(self, header: str | None) -> None:
        await self._controls(ordering_key=header or "")

    async def _controls(self, **fields: Any) -> None:
        await self.call(
            "UpdateQueueControls", pb.UpdateQueueControlsRequest(queue=self.name, **fields)
        )

    async def requeue_dead(self, ids: list[int] | None, limit: int) -> list[int]:
        request = pb.RequeueDeadRequest(queue=self.name, ids=ids or [], limit=limit)
        response = await self.call("RequeueDead", request)
        return [int(i) for i in response.ids]

    # -- calls ----------------------------------------------------------------------

    async def call(self, method: str, request: Any, *, raw: bool = False) -> Any:
        """A unary call that waits for the link within the operation timeout; errors
        are mapped to busmq exceptions (``raw``: left as gRPC errors)."""
        link = self.link
        if link.state is LinkState.CLOSED:
            raise BusClosedError(f"the link to {link.url} is closed")
        try:
            return await link.call(method, request, wait=True)
        except grpc.aio.AioRpcError as exc:
            if raw:
                raise
            raise self.error(exc) from None

    async def repeated(self, method: str, request: Any) -> Any:
        """:meth:`call` for a call that is safe to repeat, repeated while it fails
        ``UNAVAILABLE`` within the link's operation timeout. The channel's retry policy
        (:mod:`busmq.federation.retries`) covers a second or so; behind a balancer a
        gateway that died can fail calls for longer (connections to it the balancer
        kept), and an ack must not end a consumer's loop for that."""
        settings = self.link.settings
        backoff = Backoff(settings.reconnect_backoff_initial, settings.reconnect_backoff_max)
        deadline = time.monotonic() + self.link.operation_timeout
        while True:
            try:
                return await self.call(method, request, raw=True)
            except grpc.aio.AioRpcError as exc:
                delay = backoff.next()
                if exc.code() not in REPEATED or time.monotonic() + delay > deadline:
                    raise self.error(exc) from None
            await asyncio.sleep(delay)

    def error(self, exc: grpc.aio.AioRpcError) -> BusError:
        return from_rpc_error(exc, queue=self.name, target=self.link.url)


def renewal_waits(interval: Callable[[], float]) -> Iterator[float]:
    """The pauses before each renewal of a federated queue's lease: ``interval()``, the
    first one drawn from its second half. Queues attached together (a service starting
    up) would otherwise renew together, a burst of calls at the gateway every interval
    that showed in the federated p99.9."""
    yield interval() * random.uniform(0.5, 1.0)
    while True:
        yield interval()


def checked_request_id(request_id: str | None) -> str:
    """``request_id`` if valid (1-200 characters), a random one if ``None``."""
    if request_id is None:
        return uuid.uuid4().hex
    if not request_id or len(request_id) > 200:
        raise ValueError("request_id must be 1-200 characters")
    return request_id


async def push_or_queue(
    manager: FederationContext, link: Link, request: pb.PushRequest, count: int
) -> pb.PushResponse | None:
    """Push ``request`` (``count`` messages) through the link, or keep it in the outbox.

    Direct when the link is usable and no earlier push to the same queue waits in the
    outbox (so a queue's order holds), coalesced with the link's other pushes; into the
    outbox (``None``) otherwise, or when the direct call failed ambiguously: the outbox
    resends it with the same ``request_id``, which the gateway stores once. Refusals
    raise the mapped exception; a refused credential raises instead of queuing.
    """
    outbox = await manager.ready_outbox()
    if link.state is LinkState.CONNECTING:
        await link.wait_settled(link.settings.connect_timeout)
    link.require_authorized()
    if link.usable and not outbox.pending(link.url, request.queue):
        try:
            return await link.pushes.push(request)
        except AmbiguousPush:
            pass
    # Kept for later: a delay or ttl becomes the time it meant, not one counted from
    # whenever the outbox forwards it.
    absolute_timing(request)
    payload = request.SerializeToString()
    await outbox.append(link.url, request.queue, request.request_id, count, payload)
    return None


def set_timing(
    request: pb.PushRequest,
    delay: float | None,
    at: datetime | None,
    ttl: float | None,
    expires_at: datetime | None,
) -> None:
    """Delivery and expiry times on a push, checked as the core checks them."""
    due_ms(delay, at)  # ValueError for both, negative, or naive datetimes
    expires_ms(ttl, expires_at)
    if delay:
        request.delay.CopyFrom(duration(delay))
    if at is not None:
        request.deliver_at.FromDatetime(at)
    if ttl is not None:
        request.ttl.CopyFrom(duration(ttl))
    if expires_at is not None:
        request.expires_at.FromDatetime(expires_at)


def absolute_timing(request: pb.PushRequest) -> None:
    """Replace a relative delay/ttl by the time it means now."""
    now = time.time()
    if request.HasField("delay"):
        request.deliver_at.FromNanoseconds(int((now + seconds(request.delay)) * 1e9))
        request.ClearField("delay")
    if request.HasField("ttl"):
        request.expires_at.FromNanoseconds(int((now + seconds(request.ttl)) * 1e9))
        request.ClearField("ttl")
