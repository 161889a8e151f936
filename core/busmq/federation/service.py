"""Federated services: request/reply with a service whose queue lives behind a gateway.

``bus.federate(bus.service("pricing", timeout=5), "https://gateway-a:8443")`` returns a
:class:`FederatedService` with the API and events of :class:`busmq.Service`, over the
gateway's ``busmq.v1.RequestService``:

* ``request`` is one ``Call`` and ``request_stream`` one ``CallStream``. The timeout
  travels in the call and the gateway enforces it; the call's gRPC deadline is the
  timeout plus a margin, so the gateway's ``REQUEST_TIMEOUT`` normally wins (either
  way the requester gets :class:`~busmq.RequestTimeoutError`). A handler that raised
  comes back as :class:`~busmq.ServiceError` with the handler's exception type.
* Requests never go to the durable outbox: a request is synchronous (its requester
  waits for the reply within a timeout, and a reply could not come back through the
  outbox), and one replayed minutes later would run a handler for a requester that gave
  up. So while the link is not usable a request fails at once with
  :class:`~busmq.BusUnavailableError` (``FederationUnauthorizedError`` while the gateway
  refuses the credentials), and so does a call that the network cut; the handler may
  or may not have run, the requester decides whether to retry.
* ``serve`` holds a ``Serve`` stream. The gateway consumes the service's request queue
  at-least-once, as a local ``serve`` does, and hands each request over with a
  ``request_id``; the handler runs here and answers with ``Reply`` calls: a value, a
  streamed reply as chunks (the items that are ready go in one call, the last call has
  ``end``), or an error. A stream that breaks (network cut, gateway restart or drain)
  is reopened with backoff once the link is usable (a ``serving`` event with
  ``resumed``). The gateway gives the broken stream's unanswered requests back to the
  queue, so they are redelivered (here or to another handler) with a higher
  ``delivery_count``; a handler still running on one of them finishes, but its reply
  finds the request gone (``NOT_FOUND REQUEST_NOT_FOUND``) and is dropped. A handler
  may thus run twice for one request, as when a local handler dies; the requester gets
  one reply. A ``Reply`` that failed in transit while its stream still stands makes
  the stream reopen, so that the gateway gives that request back too (the counterpart
  of a local reply that Redis refused: the request is not acked). Refusals (bad
  arguments, wrong credentials) end ``serve`` with the mapped error.
* ``Request.correlation_id`` is empty for handlers served here: the gateway hands over
  the requester's own headers only.

Events on ``service.events``, with the service name as source: ``serving`` (details
``concurrency``, and ``resumed`` after a reopen), ``stopped``, ``error`` (a stream
broke, or a reply could not be sent); and the link's ``ready``, ``unauthorized``,
``closed``, ``error`` and ``state``, with the link URL as source.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from ..errors import BusClosedError, BusError, BusUnavailableError, RequestTimeoutError
from ..events import Event
from ..message import Payload, encode
from ..service import Service
from ..service_api import Request, ServeRun, ServiceAPI
from ..v1 import request_service_pb2 as pb
from ..v1 import request_service_pb2_grpc as pb_grpc
from ..v1 import types_pb2
from .backoff import Backoff
from .convert import duration, message_from_proto, outgoing, payload_value
from .errors import FederationUnauthorizedError, error_reason, from_rpc_error
from .link import Link, LinkState
from .linked import Linked
from .replies import Reply
from .streams import StreamBroken, first_response, read

if TYPE_CHECKING:
    from .context import FederationContext

log = logging.getLogger(__name__)

DEADLINE_MARGIN = 1.0
"""Seconds added to a request's timeout for its gRPC deadline, so that the gateway's own
timeout (with its typed ``REQUEST_TIMEOUT``) normally ends the call first."""


class FederatedService(ServiceAPI, Linked):
    """A service behind a remote gateway: the API and events of
    :class:`busmq.Service` (one :class:`~busmq.service_api.ServiceAPI`) over
    :class:`RemoteServiceBackend`; see the module docstring.

    Attributes:
        name: the service name.
        timeout: default seconds a request waits for its reply (for a stream: for each
            next item), taken from the service given to ``bus.federate``.
        link: the :class:`~busmq.federation.Link` to the gateway.
    """

    def __init__(self, manager: FederationContext, link: Link, service: Service) -> None:
        super().__init__(service.name, service.timeout)
        self.link = link
        self.tracing = manager.bus.tracing
        self._backend = self._remote = RemoteServiceBackend(self, manager, link)

    def __repr__(self) -> str:
        return (
            f"<FederatedService {self.name!r} via {self.link.url} "
            f"pending={self._remote.pending} serving={len(self._runs)}>"
        )

    def _on_link_event(self, event: Event) -> None:
        if "queue" in event.details:
            return  # about one federated queue (e.g. its outbox rows)
        if event.kind == "state":
            self._remote.link_changed()
        self.events.emit(event)

    async def _release(self) -> None:
        """The manager closes: stop serving (finishing the requests in hand)."""
        self.stop_serving()
        await self._serving_ended()

    async def _stop_local(self) -> None:
        self._closed = True
        self._remote.kill()
        await self._serving_ended()
        await self._remote.close()


class _Serving:
    """The remote side of one ``serve()``: its task, the current stream (one more at
    every reopen) and the signal to reopen it."""

    def __init__(self, run: ServeRun) -> None:
        self.run = run
        self.restart = asyncio.Event()
        self.generation = 0
        self.killed = False
        self.task: asyncio.Task[None] | None = None

    def restart_if_current(self, generation: int) -> None:
        if generation == self.generation:
            self.restart.set()


class RemoteServiceBackend:
    """A service's requests through a gateway's ``busmq.v1.RequestService``."""

    def __init__(self, service: FederatedService, manager: FederationContext, link: Link) -> None:
        self.name = service.name
        self.link = link
        self._events = service.events
        self._manager = manager
        self._closed = False
        self._serving: set[_Serving] = set()
        self._calls: set[Any] = set()  # requests in flight (gRPC calls)
        self._link_changed = asyncio.Event()  # replaced at every link state change

    @property
    def pending(self) -> int:
        return len(self._calls)

    def require_open(self) -> None:
        if self._manager.closed:
            raise BusClosedError("federation is closed")

    def link_changed(self) -> None:
        changed, self._link_changed = self._link_changed, asyncio.Event()
        changed.set()

    # -- requesting ----------------------------------------------------------------------

    async def request(
        self, payload: Payload, headers: Mapping[str, str] | None, limit: float
    ) -> Any:
        message = self._outgoing(payload, headers)
        await self._ready()
        request = pb.CallRequest(service=self.name, request=message, timeout=duration(limit))
        call = self._stub().Call(
            request, metadata=self.link.metadata, timeout=limit + DEADLINE_MARGIN
        )
        with self._tracked(call):
            try:
                response = await call
            except grpc.aio.AioRpcError as exc:
                raise self._request_error(exc, limit) from None
        return payload_value(response.reply.payload, response.reply.kind)

    async def request_stream(
        self, payload: Payload, headers: Mapping[str, str] | None, limit: float
    ) -> AsyncIterator[Any]:
        message = self._outgoing(payload, headers)
        await self._ready()
        request = pb.CallStreamRequest(service=self.name, request=message, timeout=duration(limit))
        call = self._stub().CallStream(request, metadata=self.link.metadata)
        try:
            with self._tracked(call):
                while True:
                    try:
                        item = await self._next_item(call, limit)
                    except grpc.aio.AioRpcError as exc:
                        raise self._request_error(exc, limit) from None
                    if item is None:
                        return
                    yield payload_value(item.payload, item.kind)
        finally:
            call.cancel()  # a no-op once the stream ended

    async def _next_item(self, call: Any, limit: float) -> pb.ReplyPayload | None:
        """The next item of a CallStream (None at its end), within ``limit`` seconds plus
        the margin; heartbeats are skipped."""
        deadline = asyncio.get_running_loop().time() + limit + DEADLINE_MARGIN
        draining = False
        while True:
            scope = asyncio.timeout_at(deadline)
            try:
                async with scope:
                    response = await call.read()
            except TimeoutError:
                if scope.expired():
                    raise RequestTimeoutError(self.name, "", limit) from None
                raise
            if response is grpc.aio.EOF:
                if draining:
                    raise BusUnavailableError(
                        f"service {self.name!r}: the gateway shut down before the end of the reply",
                        self.link.url,
                    )
                return None
            event = response.WhichOneof("event")
            if event == "item":
                return response.item  # type: ignore[no-any-return]
            if event == "state" and response.state.kind == "draining":
                draining = True

    def _outgoing(
        self, payload: Payload, headers: Mapping[str, str] | None
    ) -> types_pb2.OutgoingMessage:
        """The request as sent, refused here (as the local service does) if it cannot be."""
        tracing = self._manager.bus.tracing
        if tracing is not None:
            headers = {**tracing.current_headers(), **(headers or {})}
        encoded = encode(payload, headers, self._manager.bus.settings.max_message_bytes)
        return types_pb2.OutgoingMessage(**outgoing([encoded])[0])

    async def _ready(self) -> None:
        """Fail fast unless the link is usable (waiting only for a new link's first probe)."""
        await self.link.require_usable(f" (requests to {self.name!r} are not queued)")

    @contextlib.contextmanager
    def _tracked(self, call: Any) -> Iterator[None]:
        """Keep ``call`` cancellable by :meth:`close`, whose cancellation the waiting
        requester sees as :class:`BusClosedError`."""
        self._calls.add(call)
        try:
            yield
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and call.cancelled() and (task is None or not task.cancelling()):
                raise BusClosedError(f"service {self.name!r} is closed") from None
            raise
        finally:
            self._calls.discard(call)

    def _request_error(self, exc: grpc.aio.AioRpcError, limit: float) -> BusError:
        reason = error_reason(exc)
        if reason != "REQUEST_TIMEOUT":  # a slow handler says nothing about the link
            self.link.report(exc)
        if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED and not reason:
            # Our deadline (the timeout plus the margin) passed before the gateway's.
            return RequestTimeoutError(self.name, "", limit)
        return self._error(exc)

    # -- serving -----------------------------------------------------------------------

    async def serve(self, run: ServeRun) -> None:
        """Hold a Serve stream, reopened after breaks, until ``run`` stops (see the
        module docstring). ``concurrency`` is also the number of requests the gateway
        hands over at once (at most its ``max_prefetch``)."""
        serving = _Serving(run)
        self._serving.add(serving)
        serving.task = asyncio.create_task(
            self._serve(serving), name=f"busmq-federated-serve {self.name}"
        )
        try:
            await serving.task
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if serving.killed and (task is None or not task.cancelling()):
                return  # the bus closed
            raise
        finally:
            self._serving.discard(serving)

    def kill(self) -> None:
        """The bus closes: end every ``serve()`` now."""
        self._closed = True
        for serving in tuple(self._serving):
            serving.killed = True
            serving.run.stop()
            if serving.task is not None:
                serving.task.cancel()

    async def _serve(self, serving: _Serving) -> None:
        run = serving.run
        settings = self.link.settings
        backoff = Backoff(settings.reconnect_backoff_initial, settings.reconnect_backoff_max)
        resumed = False
        try:
            while not run.stopping.is_set():
                opened = await self._connect(run, backoff, first=not resumed)
                if opened is None:
                    break
                call, concurrency = opened
                backoff.reset()
                details: dict[str, Any] = {"concurrency": concurrency}
                if resumed:
                    details["resumed"] = True
                self._events.emit(Event("serving", self.name, details=details))
                if await self._session(serving, call):
                    break
                resumed = True
                await _wait_any(run.stopping, timeout=backoff.next())
            # Stopped between streams: finish what the broken ones left running.
            await run.finish_running()
        finally:
            await run.cancel_running()

    async def _connect(
        self, run: ServeRun, backoff: Backoff, *, first: bool
    ) -> tuple[Any, int] | None:
        """Open a Serve stream once the link is usable; None if stopped meanwhile.

        Refused credentials end the first opening; after a break they are waited out
        like a cut (the link re-probes, so a secret rotated on the gateway is taken)."""
        link = self.link
        while not run.stopping.is_set():
            if link.state is LinkState.CONNECTING:
                await link.wait_settled(link.settings.connect_timeout)
            if link.state is LinkState.CLOSED:
                raise BusClosedError(f"the link to {link.url} is closed")
            if first:
                link.require_authorized()
            if not link.usable:
                await _wait_any(run.stopping, self._link_changed)
                continue
            try:
                return await self._open(run)
            except StreamBroken as broken:
                if first and isinstance(broken.error, FederationUnauthorizedError):
                    raise broken.error from None
                self._report(broken.error)
                await _wait_any(run.stopping, timeout=backoff.next())
        return None

    async def _open(self, run: ServeRun) -> tuple[Any, int]:
        """Open a stream and wait for its ``started`` event; the call and the effective
        concurrency. Raises the mapped error for refusals, :class:`StreamBroken` otherwise."""
        link = self.link
        request = pb.ServeRequest(
            service=self.name,
            concurrency=run.concurrency,
            visibility_timeout=duration(run.visibility_timeout),
        )
        call = self._stub().Serve(request, metadata=link.metadata, wait_for_ready=True)
        first = await first_response(call, link, "the Serve stream", self._error)
        started = first.WhichOneof("event") == "started"
        return call, int(first.started.concurrency) if started else run.concurrency

    async def _session(self, serving: _Serving, call: Any) -> bool:
        """Take requests from one stream until it breaks (False) or serving stops (True:
        the requests in hand were answered while the stream stood, to take the replies)."""
        run = serving.run
        serving.generation += 1
        serving.restart.clear()
        reader = asyncio.create_task(
            self._pump(serving, call, serving.generation),
            name=f"busmq-federated-serve-read {self.name}",
        )
        stop = asyncio.ensure_future(run.stopping.wait())
        restart = asyncio.ensure_future(serving.restart.wait())
        try:
            await asyncio.wait({reader, stop, restart}, return_when=asyncio.FIRST_COMPLETED)
            if run.stopping.is_set():
                await run.finish_running()
                return True
            if reader.done() and not reader.cancelled():
                error = reader.exception()
                if not isinstance(error, StreamBroken):
                    raise error or BusError("the Serve stream reader ended")
                self._report(error.error)
            else:
                log.info("service %s: reopening the Serve stream to give back a request", self.name)
            return False
        finally:
            stop.cancel()
            restart.cancel()
            reader.cancel()
            call.cancel()  # the gateway gives back the requests still unanswered
            await asyncio.gather(reader, return_exceptions=True)

    async def _pump(self, serving: _Serving, call: Any, generation: int) -> None:
        """Hand each request to the run; raises when the stream ends."""
        run = serving.run
        while True:
            response = await read(call, self.link, self._error)
            if response is grpc.aio.EOF:
                # The gateway ended it (draining): reopening finds another one.
                raise StreamBroken(
                    BusUnavailableError("the gateway ended the Serve stream", self.link.url)
                )
            event = response.WhichOneof("event")
            if event == "request":
                if run.stopping.is_set():
                    continue  # given back when the stream closes
                served = response.request
                request = Request(message_from_proto(served.message), served.delivery_count or 1)
                reply = Reply(
                    self.link,
                    self._stub,
                    self._error,
                    served.request_id,
                    on_failed=functools.partial(serving.restart_if_current, generation),
                )
                await run.dispatch(request, reply, unless_stopping=True)
            elif event == "state":
                log.info("service %s: the gateway is %s", self.name, response.state.kind)

    def _report(self, error: BusError) -> None:
        log.info("service %s: the Serve stream broke: %s", self.name, error)
        self._events.emit(Event("error", self.name, error=error))

    # -- lifecycle ---------------------------------------------------------------------

    async def close(self) -> None:
        """Fail the requests in flight with :class:`BusClosedError` (their calls are
        cancelled). The remote service is not affected."""
        self._closed = True
        for call in tuple(self._calls):
            call.cancel()

    # -- plumbing -------------------------------------------------------------------

    def _stub(self) -> pb_grpc.RequestServiceStub:
        stub: pb_grpc.RequestServiceStub = self.link.stub(pb_grpc.RequestServiceStub)
        return stub

    def _error(self, exc: grpc.aio.AioRpcError) -> BusError:
        return from_rpc_error(exc, queue=self.name, target=self.link.url)


async def _wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Wait until one of ``events`` is set, or ``timeout`` seconds."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
