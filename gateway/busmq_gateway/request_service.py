"""``busmq.v1.RequestService``: requests to core services, and handlers behind gRPC.

``Call`` and ``CallStream`` are the core's ``Service.request`` and ``request_stream``
(one core ``Service`` per name is kept for requests, since each owns a reply queue).
``Serve`` runs the core's ``Service.serve`` with a handler that hands each request to the
stream and waits for the client's ``Reply`` calls: a value, chunks of a streamed reply,
or an error. When the stream ends, the requests still unanswered are given back and
redelivered to another handler.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from busmq import Bus, BusError, InvalidMessageError, Request, Service, ServiceError
from busmq.v1 import request_service_pb2 as pb
from busmq.v1 import request_service_pb2_grpc as pb_grpc
from busmq.v1 import types_pb2

from .access import caller, check_owner
from .config import GatewaySettings
from .convert import (
    message_to_proto,
    optional_seconds,
    outgoing_to_value,
    payload_to_value,
    value_to_payload,
)
from .errors import NotFound, RequestError, rpc_errors, to_status, unary
from .fleet import REQUEST, FleetKey
from .relay import Relay
from .requesters import Requesters
from .serving import start_serving
from .streaming import Beat, StreamCount, now, paced

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
DEFAULT_CONCURRENCY = 16


class RequestService(pb_grpc.RequestServiceServicer):
    def __init__(
        self,
        bus: Bus,
        settings: GatewaySettings,
        fleet: FleetKey,
        relay: Relay,
        draining: asyncio.Event,
    ) -> None:
        self._bus = bus
        self._settings = settings
        self._fleet = fleet
        self._relay = relay
        self._draining = draining
        self._requesters = Requesters(bus)
        self._handed: dict[str, _Handed] = {}  # the requests this gateway's streams hold
        self.streams = StreamCount()
        relay.route("Reply", self._reply, pb.ReplyRequest, pb.ReplyResponse, REQUEST)

    async def close(self) -> None:
        """Release the reply queues of the services kept for requests."""
        await self._requesters.close()

    # -- requesting --------------------------------------------------------------------

    @unary
    async def Call(
        self, request: pb.CallRequest, context: grpc.aio.ServicerContext
    ) -> pb.CallResponse:
        value, headers = outgoing_to_value(request.request, "request")
        timeout = _timeout(request, context)
        service = self._requesters.acquire(request.service)
        try:
            reply = await service.request(value, headers=headers, timeout=timeout)
        finally:
            await self._requesters.release(request.service)
        try:
            payload, kind = value_to_payload(reply)
        except InvalidMessageError:
            raise RequestError(
                "the streamed reply has items that are bytes: use CallStream",
                "REPLY_NOT_JSON",
                grpc.StatusCode.FAILED_PRECONDITION,
            ) from None
        return pb.CallResponse(reply=pb.ReplyPayload(payload=payload, kind=kind))

    async def CallStream(
        self, request: pb.CallStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CallStreamResponse]:
        with self.streams.open():
            service: Service | None = None
            async with rpc_errors(context, "CallStream"):
                value, headers = outgoing_to_value(request.request, "request")
                timeout = _timeout(request, context)
                service = self._requesters.acquire(request.service)
            if service is None:  # pragma: no cover - rpc_errors aborted the call
                return
            try:
                items = service.request_stream(value, headers=headers, timeout=timeout)
                heartbeat = self._settings.heartbeat_seconds
                async for item in paced(items, self._draining, heartbeat):
                    if item is Beat.HEARTBEAT:
                        yield pb.CallStreamResponse(heartbeat=types_pb2.Heartbeat(time=now()))
                    elif item is Beat.DRAINING:
                        state = types_pb2.StateEvent(kind="draining", source=service.name)
                        yield pb.CallStreamResponse(state=state)
                        return
                    else:
                        payload, kind = value_to_payload(item)
                        yield pb.CallStreamResponse(
                            item=pb.ReplyPayload(payload=payload, kind=kind)
                        )
            except BusError as exc:
                await context.abort_with_status(to_status(exc))
            finally:
                await self._requesters.release(request.service)

    # -- serving -----------------------------------------------------------------------

    async def Serve(
        self, request: pb.ServeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ServeResponse]:
        with self.streams.open():
            server = _Server(owner=caller().name)
            try:
                async with rpc_errors(context, "Serve"):
                    await self._start_serving(server, request)
                yield pb.ServeResponse(started=pb.ServeStarted(concurrency=server.concurrency))
                heartbeat = self._settings.heartbeat_seconds
                async for item in paced(server.requests(), self._draining, heartbeat):
                    if item is Beat.HEARTBEAT:
                        yield pb.ServeResponse(heartbeat=types_pb2.Heartbeat(time=now()))
                    elif item is Beat.DRAINING:
                        state = types_pb2.StateEvent(kind="draining", source=request.service)
                        yield pb.ServeResponse(state=state)
                        return
                    else:
                        key, core_request = item
                        # The id routes the Reply to this gateway, which holds the request.
                        request_id = self._fleet.sign(
                            REQUEST, server.owner, self._relay.gateway_id, key
                        )
                        yield pb.ServeResponse(request=_served(request_id, core_request))
            except BusError as exc:
                await context.abort_with_status(to_status(exc))
            finally:
                await self._stop_serving(server)

    async def _start_serving(self, server: _Server, request: pb.ServeRequest) -> None:
        await self._relay.ensure_serving()
        concurrency = request.concurrency or DEFAULT_CONCURRENCY
        if concurrency > self._settings.max_prefetch:
            raise RequestError(f"concurrency must be at most {self._settings.max_prefetch}")
        visibility = optional_seconds(request, "visibility_timeout", 30.0)
        assert visibility is not None
        service = self._bus.service(request.service)
        server.service, server.concurrency = service, concurrency
        server.task = await start_serving(
            service,
            functools.partial(self._hand_over, server),
            f"busmq-gateway-serve {service.name}",
            concurrency=concurrency,
            visibility_timeout=visibility,
        )

    async def _stop_serving(self, server: _Server) -> None:
        if server.task is not None:
            # Cancelled handlers give their requests back for prompt redelivery.
            server.task.cancel()
            await asyncio.gather(server.task, return_exceptions=True)
        for token in list(server.tokens):
            self._forget(server, token)
        if server.service is not None:
            try:
                await server.service.close()
            except BusError as exc:
                log.warning("closing service %s: %s", server.service.name, exc)

    async def _hand_over(self, server: _Server, request: Request) -> Any:
        """The core handler of a Serve stream: hand the request to the client, return its
        reply (a value, or an async iterator of the items of a streamed reply)."""
        assert server.service is not None
        token = secrets.token_urlsafe(18)
        handed = _Handed()
        self._handed[token] = handed
        server.tokens.add(token)
        try:
            server.inbox.put_nowait((token, request))
            part = await handed.take()
        except BaseException:
            self._forget(server, token)
            raise
        if part.kind == "chunks":
            return self._streamed(server, token, handed, part)
        handed.settle()
        self._forget(server, token)
        if part.kind == "error":
            raise ServiceError(server.service.name, part.error_type, part.message)
        return part.value

    async def _streamed(
        self, server: _Server, token: str, handed: _Handed, part: _Part
    ) -> AsyncIterator[Any]:
        assert server.service is not None
        try:
            while True:
                if part.kind == "error":
                    handed.settle()
                    raise ServiceError(server.service.name, part.error_type, part.message)
                for item in part.items:
                    yield item
                handed.settle()  # its items are pushed: the Reply that sent them returns
                if part.end:
                    return
                part = await handed.take()
        finally:
            self._forget(server, token)

    def _forget(self, server: _Server, token: str) -> None:
        server.tokens.discard(token)
        handed = self._handed.pop(token, None)
        if handed is not None:
            handed.close()

    @unary
    async def Reply(
        self, request: pb.ReplyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReplyResponse:
        owner, holder, _ = self._fleet.open(REQUEST, request.request_id)
        check_owner(owner, "request_id")
        replied: pb.ReplyResponse = await self._relay.at_holder(holder, "Reply", request, context)
        return replied

    async def _reply(self, request: pb.ReplyRequest) -> pb.ReplyResponse:
        """A Reply on the gateway whose Serve stream holds the request."""
        _, _, key = self._fleet.open(REQUEST, request.request_id)
        handed = self._handed.get(key)
        if handed is None:
            raise REQUEST.not_found()
        part = self._part(request)
        if handed.complete:
            raise RequestError(
                "the request was already answered",
                "REPLY_COMPLETE",
                grpc.StatusCode.FAILED_PRECONDITION,
            )
        if part.kind == "value" and handed.streaming:
            raise RequestError(
                "a streamed reply goes on with chunks or an error",
                "REPLY_STREAMING",
                grpc.StatusCode.FAILED_PRECONDITION,
            )
        handed.streaming = handed.streaming or part.kind == "chunks"
        handed.complete = part.kind != "chunks" or part.end
        if not await handed.offer(part):
            raise NotFound(
                "the request is no longer awaited (its Serve stream ended or the requester "
                "is gone)",
                "REQUEST_NOT_FOUND",
            )
        return pb.ReplyResponse()

    def _part(self, request: pb.ReplyRequest) -> _Part:
        kind = request.WhichOneof("reply")
        limit = self._bus.settings.max_message_bytes
        if kind == "value":
            return _Part("value", value=_reply_value(request.value, "value", limit))
        if kind == "chunks":
            items = [
                _reply_value(item, f"chunks.items[{i}]", limit)
                for i, item in enumerate(request.chunks.items)
            ]
            return _Part("chunks", items=items, end=request.chunks.end)
        if kind == "error":
            if not request.error.type:
                raise RequestError("error.type must not be empty")
            return _Part("error", error_type=request.error.type, message=request.error.message)
        raise RequestError("one of value, chunks or error is required")


@dataclass
class _Part:
    """One Reply: a value, chunks of a streamed reply, or an error."""

    kind: str
    value: Any = None
    items: list[Any] = field(default_factory=list)
    end: bool = False
    error_type: str = ""
    message: str = ""


class _Handed:
    """A request handed to a remote handler: its Reply parts, in order. A Reply returns
    once its part was taken (a chunk: once its items were pushed), which paces a client
    that streams a long reply."""

    def __init__(self) -> None:
        self.streaming = False
        self.complete = False
        self._parts: collections.deque[tuple[_Part, asyncio.Future[bool]]] = collections.deque()
        self._ready = asyncio.Event()
        self._current: asyncio.Future[bool] | None = None
        self._closed = False

    async def offer(self, part: _Part) -> bool:
        """Queue a part; True once it was taken, False if the request went away."""
        if self._closed:
            return False
        taken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._parts.append((part, taken))
        self._ready.set()
        return await taken

    async def take(self) -> _Part:
        while not self._parts:
            self._ready.clear()
            await self._ready.wait()
        part, self._current = self._parts.popleft()
        return part

    def settle(self) -> None:
        """The part last taken is done with."""
        if self._current is not None and not self._current.done():
            self._current.set_result(True)
        self._current = None

    def close(self) -> None:
        self._closed = True
        pending = [taken for _, taken in self._parts]
        if self._current is not None:
            pending.append(self._current)
        self._parts.clear()
        self._current = None
        for taken in pending:
            if not taken.done():
                taken.set_result(False)


@dataclass
class _Server:
    """One Serve stream: its core service, the serve() task and the requests handed out."""

    owner: str = ""  # the principal of the Serve stream: its request ids are its own
    service: Service | None = None
    concurrency: int = 0
    task: asyncio.Task[None] | None = None
    inbox: asyncio.Queue[tuple[str, Request]] = field(default_factory=asyncio.Queue)
    tokens: set[str] = field(default_factory=set)

    async def requests(self) -> AsyncIterator[tuple[str, Request]]:
        """The requests handed over, until serve() returns (or raises: its error)."""
        assert self.task is not None
        while True:
            get = asyncio.ensure_future(self.inbox.get())
            try:
                await asyncio.wait({get, self.task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not get.done():
                    get.cancel()
            if get.done() and not get.cancelled():
                yield get.result()
                continue
            self.task.result()
            return


def _timeout(request: pb.CallRequest | pb.CallStreamRequest, context: Any) -> float:
    limit = optional_seconds(request, "timeout", DEFAULT_TIMEOUT)
    assert limit is not None
    remaining = context.time_remaining()
    if remaining is not None:
        limit = min(limit, max(float(remaining), 0.001))
    return limit


def _reply_value(payload: pb.ReplyPayload, where: str, limit: int) -> Any:
    if len(payload.payload) > limit:
        raise RequestError(
            f"{where}: {len(payload.payload)} bytes exceed the limit of {limit} bytes",
            "MESSAGE_TOO_LARGE",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        )
    return payload_to_value(payload.payload, payload.kind, where)


def _served(token: str, request: Request) -> pb.ServedRequest:
    return pb.ServedRequest(
        request_id=token,
        message=message_to_proto(request.message, request.headers),
        delivery_count=request.delivery_count,
    )
