"""Request/reply over the bus: named services with handlers sharing a request queue.

A service ``S`` has one request queue, ``S:requests``, consumed at-least-once by every
handler process that serves it (so a handler that dies mid-request has the request
redelivered to another after the visibility timeout). Each requester owns a reply
queue, ``S:replies:<client id>.<n>``, attached with a short ttl: it lives while the
requester runs (its lease is renewed by the bus) and expires soon after it closes or
crashes, with any late replies in it.

Headers (the ``busmq-`` prefix is reserved):

- request: ``busmq-reply-to`` (the reply queue), ``busmq-correlation-id``;
- reply: ``busmq-correlation-id``, ``busmq-reply`` = ``value`` (a unary answer),
  ``chunk`` and finally ``end`` (a streamed answer, with ``busmq-seq`` 0, 1, ...), or
  ``error`` (the handler raised; the payload says what).

Handlers push replies without attaching: a push into a queue that no longer exists
fails, so a reply to a requester that is gone is dropped and never recreates its queue.
A redelivered request is handled again; the requester drops answers it already has
(unknown correlation id, or a chunk ``seq`` it has seen), so a deterministic
streaming handler's output reaches it once.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .batching import TickBatcher
from .consumer import Consumer
from .consuming import Mode
from .errors import (
    BusClosedError,
    BusError,
    InvalidNameError,
    QueueNotFoundError,
    RequestTimeoutError,
    ServiceError,
)
from .events import Event
from .keys import MAX_NAME_LENGTH, validate_name
from .message import Delivery, EncodedMessage, Message, Payload, encode
from .queue import Queue
from .service_api import (
    CORRELATION_ID,
    Handler,
    NotAwaited,
    ReplyFailed,
    Request,
    ServeRun,
    ServiceAPI,
    request_timeout,
)

if TYPE_CHECKING:
    from .context import BusContext

__all__ = [
    "CORRELATION_ID",
    "REPLY_TO",
    "Handler",
    "Request",
    "RequestTimeoutError",
    "Service",
    "ServiceError",
    "request_timeout",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

REPLY_TO = "busmq-reply-to"
REPLY_KIND = "busmq-reply"
SEQ = "busmq-seq"
MAX_SERVICE_NAME_LENGTH = 150
_MAX_BATCH = 500
_REPLY_QUEUE_CACHE = 1024


class Service(ServiceAPI):
    """A named request/reply service on the bus. Lead API: ``bus.service(name)``.

    The API is :class:`~busmq.service_api.ServiceAPI`'s; here requests go through the
    service's request queue and replies come back through this object's reply queue.

    Args:
        bus: a connected bus.
        name: the service name (a queue name of up to 150 characters).
        timeout: default seconds a request waits for its reply (for a stream: for
            each next item).
        reply_ttl: seconds the reply queue survives its requester.
        ttl: seconds the request queue survives after every requester and handler
            detached (default ``BusSettings.default_ttl``).
    """

    _instances = itertools.count(1)

    def __init__(
        self,
        bus: BusContext,
        name: str,
        *,
        timeout: float = 30.0,
        reply_ttl: float = 5.0,
        ttl: float | None = None,
    ) -> None:
        validate_name(name)
        if len(name) > MAX_SERVICE_NAME_LENGTH:
            raise InvalidNameError(
                name[:40] + "...", f"a service name is at most {MAX_SERVICE_NAME_LENGTH} long"
            )
        for label, value in (("timeout", timeout), ("reply_ttl", reply_ttl), ("ttl", ttl)):
            if value is not None and value <= 0:
                raise ValueError(f"{label} must be positive, got {value!r}")
        super().__init__(name, timeout)
        self.reply_ttl = reply_ttl
        self.ttl = ttl
        self.request_queue_name = f"{name}:requests"
        self.reply_prefix = f"{name}:replies:"
        self.reply_queue_name = f"{self.reply_prefix}{bus.client_id}.{next(self._instances)}"
        assert len(self.reply_queue_name) <= MAX_NAME_LENGTH
        self.tracing = bus.tracing
        self._backend = self._local = LocalServiceBackend(self, bus)

    def __repr__(self) -> str:
        return (
            f"<Service {self.name!r} pending={len(self._local.pending)} serving={len(self._runs)}>"
        )


class LocalServiceBackend:
    """A service's requests through its request queue on the bus."""

    def __init__(self, service: Service, bus: BusContext) -> None:
        self.name = service.name
        self._events = service.events
        self._bus = bus
        self._ttl = service.ttl
        self._reply_ttl = service.reply_ttl
        self._request_queue_name = service.request_queue_name
        self._reply_prefix = service.reply_prefix
        self._reply_queue_name = service.reply_queue_name
        self._closed = False
        # Requester side, set up on the first request.
        self._client_lock = asyncio.Lock()
        self._request_queue: Queue | None = None
        self._reply_queue: Queue | None = None
        self._reply_reader: asyncio.Task[None] | None = None
        self.pending: dict[str, _Pending] = {}
        self._batcher = TickBatcher(self._push_requests, _MAX_BATCH)
        # Handler side: reply queues kept (a bounded number) so that each one's shard
        # is looked up once.
        self._reply_queues: collections.OrderedDict[str, Queue] = collections.OrderedDict()

    def require_open(self) -> None:
        pass  # a closed bus refuses the pushes and attaches themselves

    # -- requesting ----------------------------------------------------------------------

    async def request(
        self, payload: Payload, headers: Mapping[str, str] | None, limit: float
    ) -> Any:
        correlation_id, message = self._prepare(payload, headers)
        pending = self.pending[correlation_id] = _Pending()
        try:
            return await self._within(limit, correlation_id, self._collect(message, pending))
        finally:
            self.pending.pop(correlation_id, None)

    async def _collect(self, request: EncodedMessage, pending: _Pending) -> Any:
        await self._send(request)
        items: list[Any] = []
        while True:
            message = await pending.next()
            kind = message.headers.get(REPLY_KIND)
            if kind == "chunk":
                items.append(message.data)
                continue
            return items if kind == "end" else self._value(message)

    async def request_stream(
        self, payload: Payload, headers: Mapping[str, str] | None, limit: float
    ) -> AsyncIterator[Any]:
        correlation_id, request = self._prepare(payload, headers)
        pending = self.pending[correlation_id] = _Pending()
        try:
            await self._within(limit, correlation_id, self._send(request))
            while True:
                message = await self._within(limit, correlation_id, pending.next())
                kind = message.headers.get(REPLY_KIND)
                if kind == "end":
                    return
                if kind == "chunk":
                    yield message.data
                    continue
                yield self._value(message)
                return
        finally:
            self.pending.pop(correlation_id, None)

    async def _within(self, limit: float, correlation_id: str, step: Awaitable[T]) -> T:
        scope = asyncio.timeout(limit)
        try:
            async with scope:
                return await step
        except TimeoutError:
            # Only our deadline is a request timeout; a BusTimeoutError passes through.
            if scope.expired():
                raise RequestTimeoutError(self.name, correlation_id, limit) from None
            raise

    def _prepare(
        self, payload: Payload, headers: Mapping[str, str] | None
    ) -> tuple[str, EncodedMessage]:
        """A correlation id and the encoded request. Encoding here refuses a bad request
        on its own, before it could fail the batch it would be pushed with."""
        correlation_id = uuid.uuid4().hex
        full = {**(headers or {}), REPLY_TO: self._reply_queue_name, CORRELATION_ID: correlation_id}
        if self._bus.tracing is not None:
            full = {**self._bus.tracing.current_headers(), **full}
        return correlation_id, encode(payload, full, self._bus.settings.max_message_bytes)

    def _value(self, message: Message) -> Any:
        if message.headers.get(REPLY_KIND) == "error":
            info = message.data if isinstance(message.data, dict) else {}
            raise ServiceError(
                self.name, str(info.get("type", "Error")), str(info.get("message", ""))
            )
        return message.data

    async def _send(self, request: EncodedMessage) -> None:
        await self._ensure_requester()
        await self._batcher.push(request)

    async def _push_requests(self, requests: list[EncodedMessage]) -> None:
        queue = await self._ensure_requester()
        await queue.push_encoded(requests)

    async def _ensure_requester(self) -> Queue:
        """Set up the reply queue, its reader and the request queue (once); returns
        the request queue."""
        if self._reply_reader is not None and self._request_queue is not None:
            return self._request_queue
        async with self._client_lock:
            if self._closed:
                raise BusClosedError(f"service {self.name!r} is closed")
            if self._reply_reader is not None and self._request_queue is not None:
                return self._request_queue
            replies = Queue(self._bus, self._reply_queue_name)
            requests = Queue(self._bus, self._request_queue_name)
            try:
                await replies.attach(ttl=self._reply_ttl)
                await requests.attach(ttl=self._ttl)
                consumer = replies.consume(Mode.AT_MOST_ONCE)
                await consumer.start()
            except BaseException:
                await asyncio.gather(replies.detach(), requests.detach(), return_exceptions=True)
                raise
            self._reply_queue, self._request_queue = replies, requests
            self._reply_reader = asyncio.create_task(
                self._read_replies(consumer), name=f"busmq-replies {self._reply_queue_name}"
            )
            return requests

    async def _read_replies(self, consumer: Consumer) -> None:
        failure: BaseException = BusError(f"service {self.name!r}: the reply queue was lost")
        try:
            async for delivery in consumer:
                correlation_id = delivery.headers.get(CORRELATION_ID, "")
                pending = self.pending.get(correlation_id)
                if pending is None:
                    log.debug("dropping a reply to %s: no longer awaited", correlation_id)
                    continue
                pending.feed(delivery.message)
        except Exception as exc:
            failure = exc
        if self._reply_reader is asyncio.current_task():
            # Not closed by us: fail the waiting requests; the next one sets up again.
            self._reply_reader = None
            requests, self._request_queue = self._request_queue, None
            for pending in self.pending.values():
                pending.fail(failure)
            if requests is not None:
                try:
                    await requests.detach()
                except BusError as exc:
                    log.info("service %s: could not detach: %s", self.name, exc)

    # -- serving -----------------------------------------------------------------------

    async def serve(self, run: ServeRun) -> None:
        queue = Queue(self._bus, self._request_queue_name)
        # Built before attaching, so that bad options leave nothing attached.
        consumer = queue.consume(
            Mode.AT_LEAST_ONCE,
            prefetch=run.concurrency,
            visibility_timeout=run.visibility_timeout,
        )
        await queue.attach(ttl=self._ttl)
        run.on_stop = consumer.stop
        try:
            async with consumer:
                details = {"concurrency": run.concurrency}
                self._events.emit(Event("serving", self.name, details=details))
                async for delivery in consumer:
                    reply = self._reply_for(delivery)
                    if reply is None:
                        log.warning("service %s: malformed request #%d", self.name, delivery.id)
                        await delivery.ack()
                        continue
                    request = Request(delivery.message, delivery.delivery_count, delivery)
                    await run.dispatch(request, reply, unless_stopping=False)
                # Stopped: the iteration drained what was fetched; finish those requests.
                await run.finish_running()
        finally:
            await run.cancel_running()
            try:
                await queue.detach()
            except BusError as exc:
                log.info("service %s: could not detach the request queue: %s", self.name, exc)

    def _reply_for(self, delivery: Delivery) -> _Reply | None:
        """Where the replies to ``delivery`` go; None for a malformed request."""
        reply_to = delivery.headers.get(REPLY_TO, "")
        correlation_id = delivery.headers.get(CORRELATION_ID, "")
        if not correlation_id or not self._valid_reply_to(reply_to):
            return None
        return _Reply(self, delivery, self._reply_queue_for(reply_to), correlation_id)

    def _valid_reply_to(self, reply_to: str) -> bool:
        # A request may only direct replies into this service's reply queues.
        if not reply_to.startswith(self._reply_prefix):
            return False
        try:
            validate_name(reply_to)
        except InvalidNameError:
            return False
        return True

    def _reply_queue_for(self, name: str) -> Queue:
        queue = self._reply_queues.pop(name, None) or Queue(self._bus, name)
        self._reply_queues[name] = queue
        if len(self._reply_queues) > _REPLY_QUEUE_CACHE:
            self._reply_queues.popitem(last=False)
        return queue

    @property
    def max_message_bytes(self) -> int:
        return self._bus.settings.max_message_bytes

    def forget_reply_queue(self, name: str) -> None:
        self._reply_queues.pop(name, None)

    # -- lifecycle ---------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        reader, self._reply_reader = self._reply_reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        for pending in self.pending.values():
            pending.fail(BusClosedError(f"service {self.name!r} is closed"))
        for queue in (self._reply_queue, self._request_queue):
            if queue is not None:
                try:
                    await queue.detach()
                except BusError as exc:
                    log.info("service %s: could not detach %s: %s", self.name, queue.name, exc)
        self._reply_queue = self._request_queue = None


class _Reply:
    """Sends the replies to one request into a reply queue that must already exist,
    and settles the request."""

    def __init__(
        self,
        backend: LocalServiceBackend,
        delivery: Delivery,
        queue: Queue,
        correlation_id: str,
    ) -> None:
        self._backend = backend
        self._delivery = delivery
        self._queue = queue
        self._correlation_id = correlation_id

    async def value(self, value: Any) -> None:
        await self._send("value", value)

    async def stream(self, items: AsyncIterator[Any]) -> None:
        try:
            seq = 0
            async for item in items:
                await self._send("chunk", item, seq)
                seq += 1
            await self._send("end", b"", seq)
        finally:
            # Cut short (requester gone, Redis down): run the generator's cleanup now.
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

    async def error(self, error_type: str, message: str) -> None:
        await self._send("error", {"type": error_type, "message": message})

    async def finish(self, replied: bool) -> None:
        if replied:
            await self._delivery.ack()
        # Else not acked: redelivered after the visibility timeout.

    async def give_back(self) -> None:
        await self._delivery.nack()

    async def _send(self, kind: str, value: Any, seq: int | None = None) -> None:
        headers = {CORRELATION_ID: self._correlation_id, REPLY_KIND: kind}
        if seq is not None:
            headers[SEQ] = str(seq)
        # Encoded here so that a value the handler should not have returned is told
        # apart from a failure to push (InvalidMessageError is a BusError too).
        message = encode(value, headers, self._backend.max_message_bytes)
        try:
            # A push, unlike an attach, never creates the queue: a requester that is gone
            # stays gone.
            await self._queue.push_encoded([message])
        except QueueNotFoundError:
            self._backend.forget_reply_queue(self._queue.name)
            raise NotAwaited from None
        except BusError as exc:
            raise ReplyFailed(exc) from exc


class _Pending:
    """The replies received for one request, in order, with duplicate chunks dropped."""

    def __init__(self) -> None:
        self._items: asyncio.Queue[Message | BaseException] = asyncio.Queue()
        self._next_seq = 0

    def feed(self, message: Message) -> None:
        seq = message.headers.get(SEQ)
        if seq is not None:
            if int(seq) < self._next_seq:
                return  # a redelivered request was handled again: already have it
            self._next_seq = int(seq) + 1
        self._items.put_nowait(message)

    def fail(self, exc: BaseException) -> None:
        self._items.put_nowait(exc)

    async def next(self) -> Message:
        item = await self._items.get()
        if isinstance(item, BaseException):
            raise item
        return item
