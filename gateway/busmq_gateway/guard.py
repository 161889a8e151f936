"""The method guard: every busmq RPC is registered wrapped, so that before the servicer
runs, the caller is identified and authorized (:mod:`busmq_gateway.access`) and a request
that did not parse is refused (:mod:`busmq_gateway.malformed`); and every call is counted
and timed with its status code (:mod:`busmq_gateway.rpc_metrics`).

The generated ``add_*_to_server`` functions are given a stand-in server that collects
their method handlers; each handler is then registered on the real server wrapped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from .access import CURRENT, CURRENT_ACCESS, Access, Refused
from .errors import RequestError, to_status
from .malformed import MALFORMED, MalformedLog, tolerant
from .principals import Principal
from .rpc_metrics import RpcMetrics

DRAINING = RequestError(
    "this gateway is draining: open the stream on another one",
    "GATEWAY_DRAINING",
    grpc.StatusCode.UNAVAILABLE,
)


class Guard:
    def __init__(
        self,
        access: Access,
        malformed_log: MalformedLog,
        metrics: RpcMetrics,
        draining: asyncio.Event | None = None,
    ) -> None:
        self.access = access
        self.malformed_log = malformed_log
        self.metrics = metrics
        self.draining = draining or asyncio.Event()

    def add_services(
        self,
        server: grpc.aio.Server,
        registrations: list[tuple[Callable[[Any, Any], None], Any]],
    ) -> None:
        """Register each ``(add_XServicer_to_server, servicer)`` on ``server``, guarded."""
        for service, guarded in self.guarded(registrations).items():
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, guarded),)
            )
            server.add_registered_method_handlers(service, guarded)

    def guarded(
        self, registrations: list[tuple[Callable[[Any, Any], None], Any]]
    ) -> dict[str, dict[str, grpc.RpcMethodHandler]]:
        """The method handlers of each ``(add_XServicer_to_server, servicer)``, guarded,
        by service and method name (what :meth:`add_services` registers; servicer tests
        run them without a server)."""
        found: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        for add, servicer in registrations:
            collector = _Collector()
            add(servicer, collector)
            for service, handlers in collector.services.items():
                found[service] = {
                    name: self._wrap(f"/{service}/{name}", handler)
                    for name, handler in handlers.items()
                }
        return found

    async def _admit(
        self, method: str, request: Any, context: grpc.aio.ServicerContext
    ) -> Principal:
        """The caller, allowed to make this call; else the call is aborted. A client
        stream (``request`` None) is checked request by request (:meth:`_checked`)."""
        try:
            principal = self.access.identify(context)
            if request is not None:
                self._check(principal, method, request)
        except RequestError as exc:
            await context.abort_with_status(to_status(exc))
        CURRENT.set(principal)
        CURRENT_ACCESS.set(self.access)
        return principal

    def _check(self, principal: Principal, method: str, request: Any) -> None:
        if request is MALFORMED:
            self.malformed_log.refused(method)
            raise RequestError("the request does not parse", reason="MALFORMED_REQUEST")
        self.access.check(principal, method, request)

    async def _checked(
        self, method: str, principal: Principal, requests: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """The requests of a client stream, each one the caller may not make as a
        :class:`Refused`; a request that does not parse raises (ending the stream)."""
        async for request in requests:
            try:
                self._check(principal, method, request)
            except RequestError as exc:
                if request is MALFORMED:
                    raise
                yield Refused(request, exc)
            else:
                yield request

    async def _stream(
        self,
        kind: str,
        method: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        body: Callable[[Principal], AsyncIterator[Any]],
    ) -> AsyncIterator[Any]:
        """A streaming call: admitted, holding one of the principal's streams, counted."""
        started = self.metrics.start(kind, method)
        code: grpc.StatusCode | None = None
        try:
            if self.draining.is_set():
                # A stream opened on a draining gateway would only be told to move:
                # refused at once, so that the client (or the balancer) goes elsewhere.
                await context.abort_with_status(to_status(DRAINING))
            principal = await self._admit(method, request, context)
            with contextlib.ExitStack() as slot:
                try:
                    slot.enter_context(self.access.stream(principal))
                except RequestError as exc:
                    await context.abort_with_status(to_status(exc))
                async for response in body(principal):
                    yield response
        except BaseException as exc:
            code = _code_of(exc, context)
            raise
        finally:
            self.metrics.done(kind, method, code or context.code(), started)

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        assert handler.request_deserializer is not None
        deserialize = tolerant(handler.request_deserializer)
        metrics = self.metrics
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                started = metrics.start("unary", method)
                code: grpc.StatusCode | None = None
                try:
                    await self._admit(method, request, context)
                    return await unary(request, context)
                except BaseException as exc:
                    code = _code_of(exc, context)
                    raise
                finally:
                    metrics.done("unary", method, code or context.code(), started)

            return handler._replace(request_deserializer=deserialize, unary_unary=unary_unary)
        if handler.unary_stream is not None:
            server_stream = handler.unary_stream

            async def unary_stream(
                request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                def body(_: Principal) -> AsyncIterator[Any]:
                    return server_stream(request, context)  # type: ignore[no-any-return]

                async for response in self._stream("server_stream", method, request, context, body):
                    yield response

            return handler._replace(request_deserializer=deserialize, unary_stream=unary_stream)
        if handler.stream_stream is not None:
            bidi = handler.stream_stream

            async def stream_stream(
                requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                def body(principal: Principal) -> AsyncIterator[Any]:
                    return bidi(self._checked(method, principal, requests), context)  # type: ignore[no-any-return]

                async for response in self._stream("bidi_stream", method, None, context, body):
                    yield response

            return handler._replace(request_deserializer=deserialize, stream_stream=stream_stream)
        raise TypeError(f"{method}: client-streaming-only methods are not served")


class _Collector:
    """Stands in for a server in the generated ``add_*_to_server`` functions."""

    def __init__(self) -> None:
        self.services: dict[str, Mapping[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # the same handlers come again through add_registered_method_handlers

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        self.services[service] = handlers


def _code_of(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, grpc.aio.AbortError):
        return context.code() or grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.UNKNOWN
