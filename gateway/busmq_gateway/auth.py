"""Authentication of the calls the method guard does not see: server reflection (health
is open). Every busmq RPC is authenticated, and authorized, by the guard
(:mod:`busmq_gateway.guard`, :mod:`busmq_gateway.access`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from .access import Access, bearer

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
GUARDED_PREFIX = "/busmq.v1."
_DENIED = "missing or invalid credentials"


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses reflection calls without the bearer secret of a principal with
    ``UNAUTHENTICATED``; passes health and the guarded busmq methods through."""

    def __init__(self, access: Access) -> None:
        self._access = access

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith((*OPEN_PREFIXES, GUARDED_PREFIX)):
            return handler
        if self._access.for_secret(bearer(details.invocation_metadata)) is not None:
            return handler
        return _deny(handler)


def _deny(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def deny_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)
        yield  # pragma: no cover - makes this an async generator

    options = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **options)
    if handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(deny_stream, **options)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny_unary, **options)
    return grpc.unary_unary_rpc_method_handler(deny_unary, **options)
