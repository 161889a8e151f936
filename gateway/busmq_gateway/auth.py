"""Shared-secret authentication: ``authorization: Bearer <secret>`` on every RPC but health."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
_DENIED = "missing or invalid credentials"


def secret_matches(presented: bytes, secrets: Sequence[bytes]) -> bool:
    """Whether ``presented`` is one of ``secrets``, compared in constant time against all
    of them (so timing does not tell which matched)."""
    matched = False
    for secret in secrets:
        matched |= hmac.compare_digest(presented, secret)
    return matched and bool(presented)


class SecretAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without a valid bearer secret with ``UNAUTHENTICATED``.

    The presented secret is compared in constant time against every active secret (all
    of them, so timing does not tell which matched); the refusal says nothing more.
    """

    def __init__(self, secrets: Sequence[str]) -> None:
        self._secrets = [s.encode() for s in secrets]

    def authorized(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        presented = b""
        for key, value in metadata or ():
            if key == "authorization":
                raw = value.encode() if isinstance(value, str) else value
                if raw.startswith(b"Bearer "):
                    presented = raw[len(b"Bearer ") :]
                break
        return secret_matches(presented, self._secrets)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES):
            return handler
        if self.authorized(details.invocation_metadata):
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
