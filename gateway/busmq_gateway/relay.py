"""Calls relayed to the gateway that holds what they name.

Most calls need only Redis, and any gateway serves them. A few need what lives in one
gateway's memory: a ``Reply`` goes to the ``Serve`` stream that was handed the request,
and ``SendChannel``, ``DisconnectChannel`` and ``EndChannel`` to the connected channel
end. Their ids name the holder (:mod:`busmq_gateway.fleet`); a gateway that receives
one for another gateway relays it there over the bus's own request/reply: every gateway
serves the service ``busmq-gateway.<id>``, whose requests carry the gRPC request as
bytes and the method's name, and whose replies carry the gRPC response, or the error
(its status code and reason) for the calling gateway to raise as its own.

A gateway serves its relay service from its first stream that holds something (a
``Serve`` or ``ConnectChannel`` stream): one that holds nothing has nothing relayed to it.

A relay waits at most the call's deadline, and :data:`RELAY_SECONDS`: a holder that is
gone took its streams with it, so its ids are no longer found.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from busmq import Bus, BusError, Request, RequestTimeoutError, ServiceError

from .errors import NotFound, RequestError, classify
from .requesters import Requesters
from .serving import start_serving

log = logging.getLogger(__name__)

RELAY_SECONDS = 5.0
CONCURRENCY = 64
_METHOD = "gw-method"
_SERVICE_PREFIX = "busmq-gateway."

M = TypeVar("M", bound=Message)
M2 = TypeVar("M2", bound=Message)
Handler = Callable[[bytes], Awaitable[Message]]


def service_name(gateway_id: str) -> str:
    return _SERVICE_PREFIX + gateway_id


class Relay:
    """This gateway's end of the relay: serves what others relay here, relays the rest."""

    def __init__(self, bus: Bus, gateway_id: str) -> None:
        self.gateway_id = gateway_id
        self._bus = bus
        self._handlers: dict[str, Handler] = {}
        self._requesters = Requesters(bus, limit=64, timeout=RELAY_SECONDS)
        self._serving: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self.relayed = 0
        """Calls this gateway relayed to another (for the metrics and tests)."""

    def route(self, method: str, handler: Handler) -> None:
        """Serve relayed calls of ``method`` with ``handler`` (request bytes -> response)."""
        self._handlers[method] = handler

    async def ensure_serving(self) -> None:
        """Serve the relay service (once): before handing out an id that routes here."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.shield(self._starting)
        except BaseException:
            if self._starting.done() and self._starting.exception() is not None:
                self._starting = None  # the next stream tries again
            raise

    async def _start(self) -> None:
        self._serving = await start_serving(
            self._bus.service(service_name(self.gateway_id), ttl=RELAY_SECONDS),
            self._serve,
            f"busmq-gateway-relay {self.gateway_id}",
            concurrency=CONCURRENCY,
            visibility_timeout=RELAY_SECONDS,
        )

    async def close(self) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        if self._serving is not None:
            self._serving.cancel()
            await asyncio.gather(self._serving, return_exceptions=True)
        await self._requesters.close()

    async def at_holder(
        self,
        holder: str,
        method: str,
        request: M2,
        local: Callable[[M2], Awaitable[M]],
        response_type: type[M],
        context: grpc.aio.ServicerContext,
        gone: NotFound,
    ) -> M:
        """``local(request)`` when this gateway is the ``holder``, else the call relayed
        there (see :meth:`call`)."""
        if holder == self.gateway_id:
            return await local(request)
        return await self.call(holder, method, request, response_type, context, gone)

    async def call(
        self,
        holder: str,
        method: str,
        request: Message,
        response_type: type[M],
        context: grpc.aio.ServicerContext,
        gone: NotFound,
    ) -> M:
        """``method`` with ``request`` on gateway ``holder``; its error is raised here as
        the same status. ``gone``: what to raise when the holder does not answer."""
        name = service_name(holder)
        limit = RELAY_SECONDS
        remaining = context.time_remaining()
        if remaining is not None:
            limit = min(limit, max(float(remaining), 0.001))
        service = self._requesters.acquire(name)
        self.relayed += 1
        try:
            reply = await service.request(
                request.SerializeToString(), headers={_METHOD: method}, timeout=limit
            )
        except RequestTimeoutError:
            raise gone from None
        except ServiceError as exc:
            raise _relayed_error(exc) from None
        finally:
            await self._requesters.release(name)
        return response_type.FromString(reply)

    async def _serve(self, request: Request) -> bytes:
        handler = self._handlers.get(request.headers.get(_METHOD, ""))
        if handler is None:
            raise ServiceError(self.gateway_id, "UNIMPLEMENTED:UNKNOWN_METHOD", "not relayed here")
        data = request.data
        if not isinstance(data, bytes):
            raise ServiceError(self.gateway_id, "INVALID_ARGUMENT:BAD_RELAY", "not a request")
        try:
            response = await handler(data)
        except (RequestError, BusError) as exc:
            code, reason, message = classify(exc)
            raise ServiceError(self.gateway_id, f"{code.name}:{reason}", message) from None
        return response.SerializeToString()


def _relayed_error(exc: ServiceError) -> RequestError:
    code_name, _, reason = exc.error_type.partition(":")
    code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.INTERNAL)
    return RequestError(exc.detail, reason or "RELAY_FAILED", code)
