"""Requests that do not parse: ``INVALID_ARGUMENT`` with reason ``MALFORMED_REQUEST``;
and every call counted and timed (:mod:`busmq_gateway.rpc_metrics`).

grpcio deserializes a request before the servicer sees it; a failure there ends the
call ``UNKNOWN`` and logs a traceback per call. The generated ``add_*_to_server``
functions are given a stand-in server that collects their method handlers, and each
handler is registered again with a deserializer that turns a parse failure into a
marker, which the wrapped behaviour answers with the mapped status. Refusals are logged
once per interval with their count, so a flood of garbage cannot fill a disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_status import rpc_status

from .errors import RequestError, error_status
from .rpc_metrics import RpcMetrics

log = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 60.0


class _Malformed:
    """What a request that did not parse is deserialized to."""


MALFORMED = _Malformed()


class MalformedLog:
    """One log line per interval: the first refusal, then how many followed."""

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self.total = 0
        self._unlogged = 0
        self._next = 0.0

    def refused(self, method: str) -> None:
        self.total += 1
        self._unlogged += 1
        now = time.monotonic()
        if now >= self._next:
            log.warning(
                "refused %d malformed request(s) in the last %.0f s (latest: %s)",
                self._unlogged,
                self.interval,
                method,
            )
            self._unlogged = 0
            self._next = now + self.interval


def add_services(
    server: grpc.aio.Server,
    registrations: list[tuple[Callable[[Any, Any], None], Any]],
    malformed_log: MalformedLog,
    metrics: RpcMetrics,
) -> None:
    """Register each ``(add_XServicer_to_server, servicer)`` on ``server`` with
    malformed requests refused as ``INVALID_ARGUMENT``, and every call counted and
    timed in ``metrics``."""
    for add, servicer in registrations:
        collector = _Collector()
        add(servicer, collector)
        for service, handlers in collector.services.items():
            guarded = {
                name: _guard(f"/{service}/{name}", handler, malformed_log, metrics)
                for name, handler in handlers.items()
            }
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, guarded),)
            )
            server.add_registered_method_handlers(service, guarded)


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


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``parse``, answering :data:`MALFORMED` for bytes that do not parse."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, ValueError, RuntimeError):
            return MALFORMED

    return deserialize


def _guard(
    method: str,
    handler: grpc.RpcMethodHandler,
    malformed_log: MalformedLog,
    metrics: RpcMetrics,
) -> grpc.RpcMethodHandler:
    assert handler.request_deserializer is not None
    deserialize = _tolerant(handler.request_deserializer)

    async def refuse(context: grpc.aio.ServicerContext) -> None:
        malformed_log.refused(method)
        error = RequestError("the request does not parse", reason="MALFORMED_REQUEST")
        await context.abort_with_status(rpc_status.to_status(error_status(error)))

    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = metrics.start("unary", method)
            code: grpc.StatusCode | None = None
            try:
                if request is MALFORMED:
                    await refuse(context)
                return await unary(request, context)
            except BaseException as exc:
                code = _code_of(exc, context)
                raise
            finally:
                metrics.done("unary", method, code or context.code(), started)

        return handler._replace(request_deserializer=deserialize, unary_unary=unary_unary)
    if handler.unary_stream is not None:
        stream = handler.unary_stream

        async def unary_stream(
            request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            started = metrics.start("server_stream", method)
            code: grpc.StatusCode | None = None
            try:
                if request is MALFORMED:
                    await refuse(context)
                async for response in stream(request, context):
                    yield response
            except BaseException as exc:
                code = _code_of(exc, context)
                raise
            finally:
                metrics.done("server_stream", method, code or context.code(), started)

        return handler._replace(request_deserializer=deserialize, unary_stream=unary_stream)
    raise TypeError(f"{method}: only unary requests are served")
