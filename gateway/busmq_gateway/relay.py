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
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from busmq import Bus, BusError, Request, RequestTimeoutError, ServiceError

from .errors import RequestError, classify
from .fleet import IdKind
from .requesters import Requesters
from .serving import start_serving

log = logging.getLogger(__name__)

RELAY_SECONDS = 5.0
CONCURRENCY = 64
_METHOD = "gw-method"
_SERVICE_PREFIX = "busmq-gateway."


@dataclass(frozen=True)
class _Route:
    """A method served by the holder: its local call, and its gRPC message types."""

    local: Callable[[Any], Awaitable[Message]]
    request_type: type[Message]
    response_type: type[Message]
    names: IdKind  # the kind of id the method names


def service_name(gateway_id: str) -> str:
    return _SERVICE_PREFIX + gateway_id


class Relay:
    """This gateway's end of the relay: serves what others relay here, relays the rest."""

    def __init__(self, bus: Bus, gateway_id: str) -> None:
        self.gateway_id = gateway_id
        self._bus = bus
        self._routes: dict[str, _Route] = {}
        self._requesters = Requesters(bus, limit=64, timeout=RELAY_SECONDS)
        self._serving: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self.relayed = 0
        """Calls this gateway relayed to another (for the metrics and tests)."""

    def route(
        self,
        method: str,
        local: Callable[[Any], Awaitable[Message]],
        request_type: type[Message],
        response_type: type[Message],
        names: IdKind,
    ) -> None:
        """``method``, naming an id of kind ``names``, is served by the gateway holding
        what it names, with ``local``."""
        self._routes[method] = _Route(local, request_type, response_type, names)

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
        self, holder: str, method: str, request: Message, context: grpc.aio.ServicerContext
    ) -> Any:
        """The routed ``method`` on gateway ``holder``: here, its local call; elsewhere,
        relayed there, its error raised here as the same status. A holder that does not
        answer within the call's deadline and :data:`RELAY_SECONDS` is gone, and so is
        what the id named: ``NOT_FOUND`` with the id kind's reason."""
        route = self._routes[method]
        if holder == self.gateway_id:
            return await route.local(request)
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
            raise route.names.not_found() from None
        except ServiceError as exc:
            raise _relayed_error(exc) from None
        finally:
            await self._requesters.release(name)
        return route.response_type.FromString(reply)

    async def _serve(self, request: Request) -> bytes:
        route = self._routes.get(request.headers.get(_METHOD, ""))
        if route is None:
            raise ServiceError(self.gateway_id, "UNIMPLEMENTED:UNKNOWN_METHOD", "not relayed here")
        data = request.data
        if not isinstance(data, bytes):
            raise ServiceError(self.gateway_id, "INVALID_ARGUMENT:BAD_RELAY", "not a request")
        try:
            response = await route.local(route.request_type.FromString(data))
        except (RequestError, BusError) as exc:
            code, reason, message = classify(exc)
            raise ServiceError(self.gateway_id, f"{code.name}:{reason}", message) from None
        return response.SerializeToString()


def _relayed_error(exc: ServiceError) -> RequestError:
    code_name, _, reason = exc.error_type.partition(":")
    code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.INTERNAL)
    return RequestError(exc.detail, reason or "RELAY_FAILED", code)
