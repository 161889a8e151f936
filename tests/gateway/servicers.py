"""What the servicer tests share (``test_servicers.py``, ``test_servicer_refusals.py``):
a gateway's servicers on ``grpc_testing`` (:mod:`tests.support.servicer_testing`) and
calls to them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from busmq.v1 import types_pb2
from busmq_gateway import Gateway, GatewaySettings
from tests.conftest import fast_settings
from tests.support.redis_server import RedisServer
from tests.support.servicer_testing import Outcome, in_process_server, method, outcome

SECRET = "first-secret-0123456789"
AUTH = (("authorization", f"Bearer {SECRET}"),)


@dataclass
class Servicers:
    server: Any  # grpc_testing's
    gateway: Gateway


@contextlib.asynccontextmanager
async def in_process(redis_server: RedisServer, **settings: Any) -> AsyncIterator[Servicers]:
    """A ``grpc_testing`` server of a gateway that is never started: its bus connected,
    its fleet key loaded, no port."""
    gateway = Gateway(
        GatewaySettings(
            listen="127.0.0.1:0",
            bus=fast_settings([redis_server.url], max_message_bytes=64 * 1024),
            heartbeat_seconds=0.5,
            **settings,
        )
    )
    await gateway.bus.connect()
    await gateway.fleet.load(gateway.bus, gateway.settings.fleet_secret)
    try:
        yield Servicers(in_process_server(gateway, asyncio.get_running_loop()), gateway)
    finally:
        await gateway.bus.close()


async def unary(
    servicers: Servicers,
    name: str,
    request: Any,
    metadata: Any = AUTH,
    timeout: float | None = 10,
) -> Outcome:
    queue_method = method("QueueService", name)
    rpc = servicers.server.invoke_unary_unary(queue_method, metadata, request, timeout)
    return await outcome(rpc)


TEXT = types_pb2.PAYLOAD_KIND_TEXT
JSON = types_pb2.PAYLOAD_KIND_JSON


def text(value: str) -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=value.encode(), kind=TEXT)


async def call(
    servicers: Servicers, service: str, name: str, request: Any, metadata: Any = AUTH
) -> Outcome:
    """One call of any unary or server-streaming RPC, to its end."""
    descriptor = method(service, name)
    server = servicers.server
    if descriptor.server_streaming:
        rpc = server.invoke_unary_stream(descriptor, metadata, request, 10)
    else:
        rpc = server.invoke_unary_unary(descriptor, metadata, request, 10)
    return await outcome(rpc)


async def refused_as_invalid(servicers: Servicers, service: str, request: Any, reason: str) -> None:
    """``request`` (its method named by its type) ends INVALID_ARGUMENT with ``reason``."""
    name = type(request).__name__.removesuffix("Request")
    done = await call(servicers, service, name, request)
    assert done.code is grpc.StatusCode.INVALID_ARGUMENT, done.details
    assert done.reason()[0] == reason


def json_message(value: Any, **headers: str) -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=json.dumps(value).encode(), kind=JSON, headers=headers)
