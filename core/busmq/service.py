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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
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
from .events import Event, EventHub
from .keys import MAX_NAME_LENGTH, validate_name
from .message import (
    RESERVED_HEADER_PREFIX,
    Delivery,
    EncodedMessage,
    Message,
    Payload,
    check_headers,
    encode,
)
from .queue import Queue

if TYPE_CHECKING:
    from .context import BusContext

log = logging.getLogger(__name__)
T = TypeVar("T")

REPLY_TO = "busmq-reply-to"
CORRELATION_ID = "busmq-correlation-id"
REPLY_KIND = "busmq-reply"
SEQ = "busmq-seq"
MAX_SERVICE_NAME_LENGTH = 150
_MAX_BATCH = 500
_REPLY_QUEUE_CACHE = 1024


@dataclass(frozen=True)
class Request:
    """A request as a handler sees it.

    Attributes:
        message: the request message (its headers include the reserved ones).
        delivery_count: how many times it has been delivered (more than 1 after a
            handler died or stalled while handling it).
    """

    message: Message
    delivery_count: int = 1

    @property
    def data(self) -> Any:
        """The payload as the requester passed it: bytes, str or a JSON value."""
        return self.message.data

    @property
    def headers(self) -> dict[str, str]:
        """The requester's own headers (without the reserved ``busmq-`` ones)."""
        return {
            k: v
            for k, v in self.message.headers.items()
            if not k.startswith(RESERVED_HEADER_PREFIX)
        }

    @property
    def correlation_id(self) -> str:
        return self.message.headers.get(CORRELATION_ID, "")

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1


Handler = Callable[[Request], Awaitable[Any] | AsyncIterator[Any]]
"""A coroutine function returning the reply, or an async generator function yielding
a streamed reply; a coroutine function may also return an async iterator to stream."""


class Service:
    """A named request/reply service. Lead API: ``bus.service(name)``.

    The same object can serve (``await service.serve(handler)``, in as many processes
    as wanted) and make requests (``await service.request(payload)``,
    ``async for item in service.request_stream(payload)``). ``close()`` (or
    ``async with``) stops serving and releases the reply queue.

    Events (``service.events``): ``serving`` when a ``serve()`` takes requests,
    ``stopped`` when it returns, ``error`` when a reply could not be sent.

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
        self.name = name
        self.timeout = timeout
        self.reply_ttl = reply_ttl
        self.ttl = ttl
        self.request_queue_name = f"{name}:requests"
        self.reply_prefix = f"{name}:replies:"
        self.reply_queue_name = f"{self.reply_prefix}{bus.client_id}.{next(self._instances)}"
        assert len(self.reply_queue_name) <= MAX_NAME_LENGTH
        self._bus = bus
        self._closed = False
        self.events: EventHub[Event] = EventHub()
        # Requester side, set up on the first request.
        self._client_lock = asyncio.Lock()
        self._request_queue: Queue | None = None
        self._reply_queue: Queue | None = None
        self._reply_reader: asyncio.Task[None] | None = None
        self._pending: dict[str, _Pending] = {}
        self._batcher = TickBatcher(self._push_requests, _MAX_BATCH)
        # Handler side.
        self._serving: dict[Consumer, asyncio.Event] = {}  # running serve() -> its end
        self._reply_queues: collections.OrderedDict[str, Queue] = collections.OrderedDict()

    def __repr__(self) -> str:
        return f"<Service {self.name!r} pending={len(self._pending)} serving={len(self._serving)}>"

    # -- requesting ----------------------------------------------------------------------

    async def request(
        self,
        payload: Payload,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send a request and return the reply (bytes, str or JSON value, as the
        handler returned it; a streaming handler's items as a list).

        Raises:
            RequestTimeoutError: no complete reply within ``timeout`` seconds.
            ServiceError: the handler raised.
            InvalidMessageError: the payload or headers cannot be sent.
        """
        limit = request_timeout(self.timeout, timeout)
        correlation_id, message = self._prepare(payload, headers)
        pending = self._pending[correlation_id] = _Pending()
        try:
            return await self._within(limit, correlation_id, self._collect(message, pending))
        finally:
            self._pending.pop(correlation_id, None)

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
        self,
        payload: Payload,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[Any]:
        """Send a request and yield the handler's items in order until its end.

        A unary handler's reply is yielded as the only item. ``timeout`` bounds the
        wait for each item. Close the iterator early with ``contextlib.aclosing``.

        Raises:
            RequestTimeoutError: an item did not come within ``timeout`` seconds.
            ServiceError: the handler raised (after the items it produced).
        """
        limit = request_timeout(self.timeout, timeout)
        correlation_id, request = self._prepare(payload, headers)
        pending = self._pending[correlation_id] = _Pending()
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
            self._pending.pop(correlation_id, None)

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
        if self._closed:
            raise BusClosedError(f"service {self.name!r} is closed")
        check_headers(headers)
        correlation_id = uuid.uuid4().hex
        full = {**(headers or {}), REPLY_TO: self.reply_queue_name, CORRELATION_ID: correlation_id}
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
            replies = Queue(self._bus, self.reply_queue_name)
            requests = Queue(self._bus, self.request_queue_name)
            try:
                await replies.attach(ttl=self.reply_ttl)
                await requests.attach(ttl=self.ttl)
                consumer = replies.consume(Mode.AT_MOST_ONCE)
                await consumer.start()
            except BaseException:
                await asyncio.gather(replies.detach(), requests.detach(), return_exceptions=True)
                raise
            self._reply_queue, self._request_queue = replies, requests
            self._reply_reader = asyncio.create_task(
                self._read_replies(consumer), name=f"busmq-replies {self.reply_queue_name}"
            )
            return requests

    async def _read_replies(self, consumer: Consumer) -> None:
        failure: BaseException = BusError(f"service {self.name!r}: the reply queue was lost")
        try:
            async for delivery in consumer:
                correlation_id = delivery.headers.get(CORRELATION_ID, "")
                pending = self._pending.get(correlation_id)
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
            for pending in self._pending.values():
                pending.fail(failure)
            if requests is not None:
                try:
                    await requests.detach()
                except BusError as exc:
                    log.info("service %s: could not detach: %s", self.name, exc)

    # -- serving -----------------------------------------------------------------------

    async def serve(
        self,
        handler: Handler,
        *,
        concurrency: int = 16,
        visibility_timeout: float = 30.0,
    ) -> None:
        """Handle requests until :meth:`stop_serving` or :meth:`close` (or cancellation).

        ``handler(request)`` is a coroutine function returning the reply, or an async
        generator function yielding a streamed reply (a coroutine that returns an async
        iterator streams it too). Up to ``concurrency`` requests are handled at once. A
        request is acked once its reply is sent; one whose handler died is redelivered
        after ``visibility_timeout`` seconds. If the handler raises, the requester gets
        a :class:`ServiceError`.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if self._closed:
            raise BusClosedError(f"service {self.name!r} is closed")
        queue = Queue(self._bus, self.request_queue_name)
        # Built before attaching, so that bad options leave nothing attached.
        consumer = queue.consume(
            Mode.AT_LEAST_ONCE, prefetch=concurrency, visibility_timeout=visibility_timeout
        )
        await queue.attach(ttl=self.ttl)
        done = asyncio.Event()
        self._serving[consumer] = done
        slots = asyncio.Semaphore(concurrency)
        running: set[asyncio.Task[None]] = set()
        try:
            async with consumer:
                self.events.emit(Event("serving", self.name, details={"concurrency": concurrency}))
                async for delivery in consumer:
                    await slots.acquire()
                    task = asyncio.create_task(self._handle(handler, delivery, slots))
                    running.add(task)
                    task.add_done_callback(running.discard)
                # Stopped: the iteration drained what was fetched; finish those requests.
                await asyncio.gather(*running, return_exceptions=True)
        finally:
            for task in running:
                task.cancel()  # cancelled handlers give their request back
            await asyncio.gather(*running, return_exceptions=True)
            try:
                await queue.detach()
            except BusError as exc:
                log.info("service %s: could not detach the request queue: %s", self.name, exc)
            finally:
                del self._serving[consumer]
                done.set()
                self.events.emit(Event("stopped", self.name))

    def stop_serving(self) -> None:
        """Make every ``serve()`` of this object finish the requests it has and return."""
        for consumer in self._serving:
            consumer.stop()

    async def _handle(self, handler: Handler, delivery: Delivery, slots: asyncio.Semaphore) -> None:
        try:
            reply_to = delivery.headers.get(REPLY_TO, "")
            correlation_id = delivery.headers.get(CORRELATION_ID, "")
            if not self._valid_reply_to(reply_to) or not correlation_id:
                log.warning("service %s: dropping malformed request #%d", self.name, delivery.id)
            else:
                reply = _Reply(self, self._reply_queue_for(reply_to), correlation_id)
                if not await self._answer(
                    handler, Request(delivery.message, delivery.delivery_count), reply
                ):
                    return  # not acked: redelivered after the visibility timeout
            await delivery.ack()
        except asyncio.CancelledError:
            try:
                await delivery.nack()
            except BusError as exc:
                log.info("service %s: could not give back #%d: %s", self.name, delivery.id, exc)
            raise
        except BusError as exc:
            log.warning("service %s: request #%d: %s", self.name, delivery.id, exc)
        finally:
            slots.release()

    async def _answer(self, handler: Handler, request: Request, reply: _Reply) -> bool:
        """Run the handler and send its reply; False if the reply could not be sent
        because Redis failed (so the request is to be retried)."""
        try:
            result = handler(request)
            if not isinstance(result, AsyncIterator):
                # A coroutine may also return an async iterator: it decides per request
                # whether to stream (the gateway's remote handlers do).
                result = await result
            if isinstance(result, AsyncIterator):
                try:
                    seq = 0
                    async for item in result:
                        await reply.send("chunk", item, seq)
                        seq += 1
                    await reply.send("end", b"", seq)
                finally:
                    # Cut short (requester gone, Redis down): run the generator's cleanup now.
                    aclose = getattr(result, "aclose", None)
                    if aclose is not None:
                        await aclose()
            else:
                await reply.send("value", result)
        except _RequesterGone:
            log.debug("service %s: requester of %s is gone", self.name, reply.correlation_id)
        except _ReplyFailed as exc:
            log.warning("service %s: could not reply: %s", self.name, exc.__cause__)
            self.events.emit(Event("error", self.name, error=exc.__cause__))
            return False
        except Exception as exc:
            log.info("service %s: handler raised %r", self.name, exc)
            await self._send_error(reply, exc)
        return True

    async def _send_error(self, reply: _Reply, exc: Exception) -> None:
        # A handler that passes on a ServiceError (a proxy, a remote handler) passes on
        # the original error's type and message.
        if isinstance(exc, ServiceError):
            error = {"type": exc.error_type, "message": exc.detail}
        else:
            error = {"type": type(exc).__name__, "message": str(exc)}
        try:
            await reply.send("error", error)
        except (_ReplyFailed, _RequesterGone) as failure:
            log.info("service %s: could not send the error reply: %s", self.name, failure)

    def _valid_reply_to(self, reply_to: str) -> bool:
        # A request may only direct replies into this service's reply queues.
        if not reply_to.startswith(self.reply_prefix):
            return False
        try:
            validate_name(reply_to)
        except InvalidNameError:
            return False
        return True

    def _reply_queue_for(self, name: str) -> Queue:
        # Kept (a bounded number) so that each one's shard is looked up once.
        queue = self._reply_queues.pop(name, None) or Queue(self._bus, name)
        self._reply_queues[name] = queue
        if len(self._reply_queues) > _REPLY_QUEUE_CACHE:
            self._reply_queues.popitem(last=False)
        return queue

    # -- lifecycle ---------------------------------------------------------------------

    async def close(self) -> None:
        """Stop serving (finishing the requests in hand), fail the requests still
        waiting with :class:`BusClosedError`, and release the queues."""
        if self._closed:
            return
        self._closed = True
        self.stop_serving()
        await asyncio.gather(*(done.wait() for done in self._serving.values()))
        reader, self._reply_reader = self._reply_reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        for pending in self._pending.values():
            pending.fail(BusClosedError(f"service {self.name!r} is closed"))
        for queue in (self._reply_queue, self._request_queue):
            if queue is not None:
                try:
                    await queue.detach()
                except BusError as exc:
                    log.info("service %s: could not detach %s: %s", self.name, queue.name, exc)
        self._reply_queue = self._request_queue = None

    async def __aenter__(self) -> Service:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _RequesterGone(Exception):
    """The reply queue no longer exists: the requester closed or crashed."""


class _ReplyFailed(Exception):
    """Redis failed while a reply was pushed (the cause says how)."""


class _Reply:
    """Sends the replies to one request, into a reply queue that must already exist."""

    def __init__(self, service: Service, queue: Queue, correlation_id: str) -> None:
        self.service = service
        self.queue = queue
        self.correlation_id = correlation_id

    async def send(self, kind: str, value: Any, seq: int | None = None) -> None:
        headers = {CORRELATION_ID: self.correlation_id, REPLY_KIND: kind}
        if seq is not None:
            headers[SEQ] = str(seq)
        # Encoded here so that a value the handler should not have returned is told
        # apart from a failure to push (InvalidMessageError is a BusError too).
        message = encode(value, headers, self.service._bus.settings.max_message_bytes)
        try:
            # A push, unlike an attach, never creates the queue: a requester that is gone
            # stays gone.
            await self.queue.push_encoded([message])
        except QueueNotFoundError:
            self.service._reply_queues.pop(self.queue.name, None)
            raise _RequesterGone from None
        except BusError as exc:
            raise _ReplyFailed from exc


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


def request_timeout(default: float, timeout: float | None) -> float:
    """A request's time limit: ``timeout``, else the service's ``default``."""
    limit = default if timeout is None else timeout
    if limit <= 0:
        raise ValueError(f"timeout must be positive, got {limit!r}")
    return limit
