"""Federated queues: a queue that lives behind a remote gateway, with the queue API.

``bus.federate(bus.queue("orders"), "https://gateway-a:8443")`` returns a
:class:`FederatedQueue`. Its methods and events are those of :class:`busmq.Queue`
where they make sense over the network, with these differences:

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
* Consumers resume across link breaks; see :mod:`busmq.federation.consumer`.
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
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import grpc

from ..consuming import LATEST, Mode
from ..controls import RateLimit, RetryPolicy, due_ms, expires_ms
from ..errors import (
    BusClosedError,
    BusError,
    QueueNotFoundError,
    UnknownMessageError,
)
from ..events import Event, EventHub
from ..keys import validate_name
from ..message import Delivery, EncodedMessage, Payload, encode_item
from ..pushing import PushResult
from ..queue import Retention
from ..v1 import queue_service_pb2 as pb
from .consumer import FederatedConsumer
from .convert import duration, outgoing, seconds
from .errors import AmbiguousPush, RemoteError, error_reason, from_rpc_error
from .link import Link, LinkState

if TYPE_CHECKING:
    from .manager import FederationManager

log = logging.getLogger(__name__)
Headers = Mapping[str, str]


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


class FederatedQueue:
    """A queue in another datacenter, used through its gateway (see the module docstring).

    Attributes:
        name: the queue name.
        link: the :class:`~busmq.federation.Link` to the gateway.
        events: queue and link events.
        pushed: messages this client stored remotely (directly or forwarded).
        consumed: messages this client's consumers handed out.
    """

    def __init__(self, manager: FederationManager, link: Link, name: str) -> None:
        self.name = validate_name(name)
        self.link = link
        self.events: EventHub[Event] = EventHub()
        self.pushed = 0
        self.consumed = 0
        self._manager = manager
        self._attachment: str | None = None
        self._attach_request: pb.AttachQueueRequest | None = None
        self._lease = 0.0
        self._renewer: asyncio.Task[None] | None = None
        self._renew_now = asyncio.Event()
        self._consumers: set[FederatedConsumer] = set()
        self._last_delivered: tuple[int, int] | None = None  # (id, push time ms)

    def __repr__(self) -> str:
        return f"<FederatedQueue {self.name!r} via {self.link.url} attached={self.attached}>"

    # -- state ----------------------------------------------------------------------

    @property
    def target(self) -> str:
        return self.link.url

    @property
    def attached(self) -> bool:
        return self._attachment is not None

    @property
    def state(self) -> LinkState:
        """The link's state (``ready``, ``disconnected``, ...)."""
        return self.link.state

    @property
    def outbox_depth(self) -> int:
        """Messages pushed to this queue that wait in the outbox."""
        return self._manager.outbox.queue_depth(self.target, self.name)

    async def lag(self) -> ConsumerLag:
        """How far behind this process's consumers are (one ``GetQueue`` call)."""
        info = await self._info()
        last = self._last_delivered
        if info is None:
            return ConsumerLag(0, 0.0, None if last is None else last[0])
        if last is None:
            return ConsumerLag(int(info.count), 0.0, None)
        last_id, push_ms = last
        behind = max(0, int(info.last_id) - last_id)
        age = max(0.0, time.time() - push_ms / 1000) if behind else 0.0
        return ConsumerLag(behind, age, last_id)

    def _note_delivered(self, item: Delivery) -> None:
        self.consumed += 1
        if self._last_delivered is None or item.id >= self._last_delivered[0]:
            self._last_delivered = (item.id, item.message.timestamp_ms)

    # -- attachment -----------------------------------------------------------------

    async def attach(
        self,
        *,
        ttl: float | None = None,
        retention: Retention | None = None,
        max_backlog: int | None = None,
    ) -> bool:
        """Attach to the remote queue, creating it if needed; returns whether it was
        created. Arguments as :meth:`busmq.Queue.attach`: ``max_backlog=None`` keeps the
        current limit, ``0`` removes it (``AttachQueueRequest.remove_max_backlog``; a
        gateway older than that field ignores it and keeps the limit)."""
        if self._attachment is not None:
            return False
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be positive")
        if max_backlog is not None and max_backlog < 0:
            raise ValueError("max_backlog must not be negative")
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
        self._renewer = asyncio.create_task(
            self._renew_loop(), name=f"busmq-federated-renewal {self.name}"
        )
        self.events.emit(Event("attached", self.name, details={"created": created}))
        return created

    async def _attach(self, request: pb.AttachQueueRequest) -> bool:
        response = await self._call("AttachQueue", request)
        self._attachment = str(response.attachment_id)
        self._attach_request = request
        self._lease = seconds(response.lease_duration) or 15.0
        self._manager._attached(self, self.name, True)
        return bool(response.created)

    async def detach(self) -> None:
        """Stop this client's consumers and release the attachment."""
        if self._attachment is None:
            return
        await self._stop_local()
        attachment, self._attachment = self._attachment, None
        self._manager._attached(self, self.name, False)
        try:
            await self._call("DetachQueue", pb.DetachQueueRequest(attachment_id=attachment))
        except QueueNotFoundError:
            pass  # the gateway no longer had it: it is released either way
        except RemoteError as exc:
            # A gateway restarted since the attach knows nothing of it: nothing is left
            # to release (its lease lapses on its own).
            if exc.reason != "ATTACHMENT_NOT_FOUND":
                raise
        finally:
            self.events.emit(Event("detached", self.name))

    async def renew(self) -> bool:
        """Renew the lease now (a task does it on its own); False if the queue is gone."""
        if self._attachment is None:
            return False
        request = pb.RenewAttachmentRequest(attachment_id=self._attachment)
        try:
            await self._call("RenewAttachment", request, raw=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.NOT_FOUND:
                raise self._error(exc) from None
            if error_reason(exc) == "ATTACHMENT_NOT_FOUND":
                return await self.reattach()
            await self._lost()
            return False
        return True

    async def reattach(self) -> bool:
        """Attach again with the original arguments (the gateway forgot the
        attachment, or the queue expired while the link was down)."""
        if self._attach_request is None or self._attachment is None:
            return False
        created = await self._attach(self._attach_request)
        details = {"created": created, "reattached": True}
        self.events.emit(Event("attached", self.name, details=details))
        return True

    async def _renew_loop(self) -> None:
        while self._attachment is not None:
            self._renew_now.clear()
            try:
                async with asyncio.timeout(self._lease / 3):
                    await self._renew_now.wait()
            except TimeoutError:
                pass
            try:
                await self.renew()
            except BusError as exc:
                log.info("renewal of federated %s failed: %s", self.name, exc)
                self.events.emit(Event("error", self.name, error=exc))

    async def _lost(self) -> None:
        """The remote queue was closed or expired."""
        self._attachment = None
        self._manager._attached(self, self.name, False)
        await self._stop_local(renewer=False)
        self.events.emit(Event("closed", self.name))

    async def _release(self) -> None:
        await self.detach()

    async def _stop_local(self, renewer: bool = True) -> None:
        for consumer in tuple(self._consumers):
            await consumer.close()
        if renewer and self._renewer is not None and self._renewer is not asyncio.current_task():
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None

    def _on_link_event(self, event: Event) -> None:
        queue = event.details.get("queue")
        if queue is not None and queue != self.name:
            return
        if event.kind == "ready":
            self._renew_now.set()  # renew at once: the lease may be close to lapsing
        self.events.emit(event)

    async def __aenter__(self) -> FederatedQueue:
        await self.attach()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.detach()

    # -- pushing --------------------------------------------------------------------

    async def push(
        self,
        value: Payload,
        *,
        headers: Headers | None = None,
        request_id: str | None = None,
        **timing: Any,
    ) -> int | None:
        """Push one message; returns its id, or ``None`` if it waits in the outbox
        (durably; it will be forwarded in order). Raises ``OutboxFullError`` if it had
        to wait and the outbox is full. ``delay``/``at`` and ``ttl``/``expires_at`` as
        in :meth:`busmq.Queue.push` (a push kept in the outbox keeps its due time)."""
        ids = await self.push_batch([(value, headers)], request_id=request_id, **timing)
        return None if ids is None else ids[0]

    async def push_batch(
        self,
        items: Iterable[Payload | tuple[Payload, Headers | None] | EncodedMessage],
        *,
        request_id: str | None = None,
        **timing: Any,
    ) -> list[int] | None:
        """Push several messages atomically and in order; their ids, or ``None`` if
        they wait in the outbox. Items and timing as in :meth:`busmq.Queue.push_batch`."""
        limit = self._manager.bus.settings.max_message_bytes
        encoded = [encode_item(item, limit) for item in items]
        result = await self.push_encoded(encoded, request_id=request_id, **timing)
        return None if result is None else result.ids

    async def push_encoded(
        self,
        encoded: Sequence[EncodedMessage],
        *,
        request_id: str | None = None,
        delay: float | None = None,
        at: datetime | None = None,
        ttl: float | None = None,
        expires_at: datetime | None = None,
    ) -> PushResult | None:
        """Push encoded messages; a :class:`~busmq.PushResult`, or ``None`` if queued
        in the outbox."""
        self._require_open()
        if not encoded:
            return PushResult([], False)
        request = pb.PushRequest(
            queue=self.name, messages=outgoing(encoded), request_id=checked_request_id(request_id)
        )
        set_timing(request, delay, at, ttl, expires_at)
        response = await push_or_queue(self._manager, self.link, request, len(encoded))
        if response is None:
            return None
        if not response.duplicate:
            self.pushed += len(encoded)
        return PushResult(list(response.ids), bool(response.duplicate))

    # -- consuming ------------------------------------------------------------------

    def consume(
        self,
        mode: Mode = Mode.AT_MOST_ONCE,
        *,
        max: int | None = None,
        from_id: int = LATEST,
        prefetch: int = 100,
        visibility_timeout: float = 30.0,
        max_deliveries: int | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> FederatedConsumer:
        """A resumable consumer; arguments as :meth:`busmq.Queue.consume`."""
        self._require_open()
        return FederatedConsumer(
            self,
            mode,
            max=max,
            from_id=from_id,
            prefetch=prefetch,
            visibility_timeout=visibility_timeout,
            max_deliveries=max_deliveries,
            retry_policy=retry_policy,
        )

    # -- processing controls (see busmq.controls) --------------------------------------

    async def requeue_dead(self, ids: Sequence[int] | None = None, *, limit: int = 0) -> list[int]:
        """As :meth:`busmq.Queue.requeue_dead`."""
        request = pb.RequeueDeadRequest(queue=self.name, ids=list(ids or []), limit=limit)
        response = await self._call("RequeueDead", request)
        return [int(i) for i in response.ids]

    async def pause(self) -> None:
        await self._controls(paused=True)

    async def resume(self) -> None:
        await self._controls(paused=False)

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

    async def drop_expired(self, drop: bool = True) -> None:
        await self._controls(drop_expired=drop)

    async def _controls(self, **fields: Any) -> None:
        await self._call(
            "UpdateQueueControls", pb.UpdateQueueControlsRequest(queue=self.name, **fields)
        )

    async def ack(self, *ids: int) -> int:
        """Acknowledge at-least-once deliveries by id, whichever consumer received them;
        raises :class:`UnknownMessageError` for ids that were not pending."""
        unknown = await self._ack_ids(list(ids))
        if unknown:
            raise UnknownMessageError(self.name, unknown)
        return len(ids)

    async def _ack_ids(self, ids: list[int]) -> list[int]:
        if not ids:
            return []
        response = await self._call("Ack", pb.AckRequest(queue=self.name, ids=ids))
        return [int(i) for i in response.unknown_ids]

    # -- inspection and management ------------------------------------------------

    async def _info(self) -> Any:
        try:
            return await self._call("GetQueue", pb.GetQueueRequest(queue=self.name))
        except QueueNotFoundError:
            return None

    async def count(self) -> int:
        info = await self._info()
        return 0 if info is None else int(info.count)

    async def exists(self) -> bool:
        return await self._info() is not None

    async def ttl(self) -> float | None:
        info = await self._info()
        return None if info is None else seconds(info.ttl)

    async def last_id(self) -> int:
        info = await self._info()
        return 0 if info is None else int(info.last_id)

    async def metadata(self) -> dict[str, str]:
        info = await self._info()
        return {} if info is None else dict(info.metadata)

    async def set_metadata(self, values: Mapping[str, str]) -> None:
        """Set user metadata fields of the remote queue."""
        self._require_open()
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in values.items()):
            raise ValueError("metadata must map non-empty str to str")
        request = pb.UpdateQueueMetadataRequest(queue=self.name, metadata=dict(values))
        await self._call("UpdateQueueMetadata", request)

    async def flush(self) -> None:
        """Remove every stored message of the remote queue."""
        self._require_open()
        await self._call("FlushQueue", pb.FlushQueueRequest(queue=self.name))

    async def close(self) -> None:
        """Destroy the remote queue for every client."""
        await self._stop_local(renewer=False)
        with contextlib.suppress(QueueNotFoundError):
            await self._call("CloseQueue", pb.CloseQueueRequest(queue=self.name))
        if self._attachment is not None:
            await self._lost()

    # -- plumbing -------------------------------------------------------------------

    def _require_open(self) -> None:
        if self._manager.closed:
            raise BusClosedError("federation is closed")

    async def _call(self, method: str, request: Any, *, raw: bool = False) -> Any:
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
            raise self._error(exc) from None

    def _error(self, exc: grpc.aio.AioRpcError) -> BusError:
        return from_rpc_error(exc, queue=self.name, target=self.target)


def checked_request_id(request_id: str | None) -> str:
    """``request_id`` if valid (1-200 characters), a random one if ``None``."""
    if request_id is None:
        return uuid.uuid4().hex
    if not request_id or len(request_id) > 200:
        raise ValueError("request_id must be 1-200 characters")
    return request_id


async def push_or_queue(
    manager: FederationManager, link: Link, request: pb.PushRequest, count: int
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
