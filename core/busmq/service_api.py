"""The service API written once over a :class:`ServiceBackend`.

:class:`ServiceAPI` is a request/reply service whatever carries its requests: the
argument checks, the request timeout, ``serve`` with its concurrency, the running of
handlers and the shape of their replies (a value, a stream of items, an error), stop
and close, and the events. A backend says how requests travel and how replies go back:

* :class:`busmq.Service` (``service.py``): the request queue on the bus, consumed
  at-least-once by the handlers; replies pushed into each requester's reply queue;
* :class:`busmq.federation.FederatedService` (``federation/service.py``): ``Call`` /
  ``CallStream`` to a gateway, handlers fed by a ``Serve`` stream that resumes after
  breaks, replies sent with ``Reply`` calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Self

from .errors import BusClosedError, BusError, ServiceError
from .events import Event, EventHub
from .message import (
    RESERVED_HEADER_PREFIX,
    Delivery,
    ForwardTarget,
    Message,
    Payload,
    check_headers,
)

if TYPE_CHECKING:
    from .tracing import Tracing

log = logging.getLogger(__name__)

CORRELATION_ID = "busmq-correlation-id"


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
    _delivery: Delivery | None = field(default=None, repr=False, compare=False)

    async def forward(
        self, target: ForwardTarget, value: Payload, *, headers: Mapping[str, str] | None = None
    ) -> bool:
        """Store ``value`` in ``target`` once for this request, however often it is
        handled (a handler that died before its reply is run again): the request is
        settled by the reply, as always. ``False`` if the request was settled already.
        A request served through a gateway cannot forward (``BusError``)."""
        return await self.forward_batch(target, [(value, headers) if headers else value])

    async def forward_batch(self, target: ForwardTarget, items: Iterable[Any]) -> bool:
        """:meth:`forward` for several messages, stored together."""
        if self._delivery is None:
            raise BusError("forward() takes a request of a service on this bus")
        return await self._delivery.forward_batch(target, items, ack=False)

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
        """The request's correlation id (empty for requests served through a gateway)."""
        return self.message.headers.get(CORRELATION_ID, "")

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1


Handler = Callable[[Request], Awaitable[Any] | AsyncIterator[Any]]
"""A coroutine function returning the reply, or an async generator function yielding
a streamed reply; a coroutine function may also return an async iterator to stream."""


class NotAwaited(Exception):
    """Nobody awaits the reply any more (the requester is gone, or the request was
    given back): it is dropped."""


class ReplyFailed(Exception):
    """A reply did not get through although its request may still be awaited; the
    request is not settled, so it is handled again."""

    def __init__(self, error: BusError) -> None:
        super().__init__(str(error))
        self.error = error


class ReplySink(Protocol):
    """Where the replies to one request go, and how the request is settled.

    ``value``, ``stream`` and ``error`` raise :class:`NotAwaited` or
    :class:`ReplyFailed`; a value that cannot be sent raises
    :class:`~busmq.InvalidMessageError`, which goes back to the requester as the
    handler's error.
    """

    async def value(self, value: Any) -> None: ...

    async def stream(self, items: AsyncIterator[Any]) -> None:
        """Send the items in order, then the end; close ``items`` however it ends."""

    async def error(self, error_type: str, message: str) -> None: ...

    async def finish(self, replied: bool) -> None:
        """The handler is done: ``replied`` is False when a reply failed in transit."""

    async def give_back(self) -> None:
        """The handler was cancelled: let the request be handled again."""


class ServeRun:
    """One ``serve()``: its handler and options, its stop signal and the handler tasks
    (which may outlive the stream or consumer that fed them)."""

    def __init__(
        self,
        service: str,
        events: EventHub[Event],
        handler: Handler,
        concurrency: int,
        visibility_timeout: float,
        tracing: Tracing | None = None,
    ) -> None:
        self.service = service
        self.tracing = tracing
        self.events = events
        self.handler = handler
        self.concurrency = concurrency
        self.visibility_timeout = visibility_timeout
        self.stopping = asyncio.Event()
        self.done = asyncio.Event()
        self.on_stop: Callable[[], None] | None = None
        self._slots = asyncio.Semaphore(concurrency)
        self._running: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        self.stopping.set()
        if self.on_stop is not None:
            self.on_stop()

    async def dispatch(self, request: Request, reply: ReplySink, *, unless_stopping: bool) -> None:
        """Handle ``request`` in a task of its own once a slot is free (with
        ``unless_stopping``: not at all if serving stops meanwhile)."""
        await self._slots.acquire()
        if unless_stopping and self.stopping.is_set():
            self._slots.release()
            return
        task = asyncio.create_task(self._handle(request, reply))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def finish_running(self) -> None:
        """Wait for the handlers running now."""
        await asyncio.gather(*self._running, return_exceptions=True)

    async def cancel_running(self) -> None:
        """Cancel the handlers still running (they give their request back)."""
        for task in self._running:
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)

    async def _handle(self, request: Request, reply: ReplySink) -> None:
        try:
            if self.tracing is None:
                answered = await self._answer(request, reply)
            else:
                with self.tracing.process(
                    self.service, request.message.headers, request.message.id
                ):
                    answered = await self._answer(request, reply)
            await reply.finish(answered)
        except asyncio.CancelledError:
            try:
                await reply.give_back()
            except BusError as exc:
                log.info("service %s: could not give a request back: %s", self.service, exc)
            raise
        except BusError as exc:
            log.warning("service %s: could not settle a request: %s", self.service, exc)
        finally:
            self._slots.release()

    async def _answer(self, request: Request, reply: ReplySink) -> bool:
        """Run the handler and send its reply; False if a reply failed in transit."""
        try:
            result = self.handler(request)
            if not isinstance(result, AsyncIterator):
                # A coroutine may also return an async iterator: it decides per request
                # whether to stream (the gateway's remote handlers do).
                result = await result
            if isinstance(result, AsyncIterator):
                await reply.stream(result)
            else:
                await reply.value(result)
        except NotAwaited:
            log.debug("service %s: a reply is no longer awaited; dropped", self.service)
        except ReplyFailed as failed:
            log.warning("service %s: could not reply: %s", self.service, failed.error)
            self.events.emit(Event("error", self.service, error=failed.error))
            return False
        except Exception as exc:
            log.info("service %s: handler raised %r", self.service, exc)
            return await self._send_error(reply, exc)
        return True

    async def _send_error(self, reply: ReplySink, exc: Exception) -> bool:
        # A handler that passes on a ServiceError (a proxy, a remote handler) passes on
        # the original error's type and message.
        if isinstance(exc, ServiceError):
            error_type, detail = exc.error_type, exc.detail
        else:
            error_type, detail = type(exc).__name__, str(exc)
        try:
            await reply.error(error_type, detail)
        except NotAwaited:
            log.debug("service %s: an error reply is no longer awaited", self.service)
        except ReplyFailed as failed:
            log.warning("service %s: could not send an error reply: %s", self.service, failed)
            self.events.emit(Event("error", self.service, error=failed.error))
            return False
        except BusError as refused:
            log.warning("service %s: the error reply was refused: %s", self.service, refused)
        return True


class ServiceBackend(Protocol):
    """What a service object needs from whatever carries its requests."""

    def require_open(self) -> None:
        """Raise :class:`~busmq.BusClosedError` if the bus (or federation) is closed."""

    async def request(
        self, payload: Payload, headers: Mapping[str, str] | None, limit: float
    ) -> Any:
        """Send a request and return its reply (a stream's items as a list)."""
        ...

    def request_stream(
        self, payload: Payload, headers: Mapping[str, str] | None, limit: float
    ) -> AsyncIterator[Any]:
        """Send a request and yield its reply's items until the end."""
        ...

    async def serve(self, run: ServeRun) -> None:
        """Feed ``run`` requests until it stops; its handlers are finished or
        cancelled when this returns."""

    async def close(self) -> None:
        """Fail the requests still waiting with :class:`~busmq.BusClosedError` and
        release what the requester side holds."""


class ServiceAPI:
    """A named request/reply service (see the subclasses :class:`busmq.Service` and
    :class:`busmq.federation.FederatedService`).

    The same object can serve (``await service.serve(handler)``, in as many processes
    as wanted) and make requests (``await service.request(payload)``,
    ``async for item in service.request_stream(payload)``). ``close()`` (or
    ``async with``) stops serving and fails the requests still waiting.

    Events (``service.events``): ``serving`` when a ``serve()`` takes requests,
    ``stopped`` when it returns, ``error`` when a reply could not be sent.

    Attributes:
        name: the service name.
        timeout: default seconds a request waits for its reply (for a stream: for
            each next item).
    """

    _backend: ServiceBackend

    tracing: Tracing | None = None
    """Trace propagation (:mod:`busmq.tracing`): each handler runs in a span."""

    def __init__(self, name: str, timeout: float) -> None:
        self.name = name
        self.timeout = timeout
        self.events: EventHub[Event] = EventHub()
        self._closed = False
        self._runs: set[ServeRun] = set()

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
            BusUnavailableError: (federated) the link is not usable, or the call was cut.
        """
        limit = self._prepare(headers, timeout)
        return await self._backend.request(payload, headers, limit)

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
            BusUnavailableError: (federated) the link is not usable, or the stream was
                cut before the end of the reply.
        """
        limit = self._prepare(headers, timeout)
        items = self._backend.request_stream(payload, headers, limit)
        try:
            async for item in items:
                yield item
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

    def _prepare(self, headers: Mapping[str, str] | None, timeout: float | None) -> float:
        limit = request_timeout(self.timeout, timeout)
        self._require_open()
        check_headers(headers)
        return limit

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
        request is settled once its reply is sent; one whose handler died is redelivered
        after ``visibility_timeout`` seconds. If the handler raises, the requester gets
        a :class:`ServiceError`.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if visibility_timeout <= 0:
            raise ValueError(f"visibility_timeout must be positive, got {visibility_timeout!r}")
        self._require_open()
        run = ServeRun(
            self.name, self.events, handler, concurrency, visibility_timeout, self.tracing
        )
        self._runs.add(run)
        try:
            await self._backend.serve(run)
        finally:
            self._runs.discard(run)
            run.done.set()
            self.events.emit(Event("stopped", self.name))

    def stop_serving(self) -> None:
        """Make every ``serve()`` of this object finish the requests it has and return."""
        for run in tuple(self._runs):
            run.stop()

    # -- lifecycle ---------------------------------------------------------------------

    async def close(self) -> None:
        """Stop serving (finishing the requests in hand), fail the requests still
        waiting with :class:`BusClosedError`, and release what the requester holds."""
        if self._closed:
            return
        self._closed = True
        self.stop_serving()
        await self._serving_ended()
        await self._backend.close()

    async def _serving_ended(self) -> None:
        """Wait until every ``serve()`` of this object has returned."""
        await asyncio.gather(*(run.done.wait() for run in tuple(self._runs)))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _require_open(self) -> None:
        if self._closed:
            raise BusClosedError(f"service {self.name!r} is closed")
        self._backend.require_open()


def request_timeout(default: float, timeout: float | None) -> float:
    """A request's time limit: ``timeout``, else the service's ``default``."""
    limit = default if timeout is None else timeout
    if limit <= 0:
        raise ValueError(f"timeout must be positive, got {limit!r}")
    return limit
