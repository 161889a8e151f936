from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from busmq import Bus
from busmq.v1 import (
    channel_service_pb2_grpc,
    persistable_service_pb2_grpc,
    queue_service_pb2_grpc,
    request_service_pb2_grpc,
)
from busmq_gateway import Gateway, GatewaySettings
from tests.conftest import fast_settings
from tests.support.browser import browser  # noqa: F401 - a fixture of the dashboard tests
from tests.support.redis_server import RedisServer

R = TypeVar("R")
SECRETS = ("first-secret-0123456789", "rotated-secret-0123456789")
AUTH = (("authorization", f"Bearer {SECRETS[0]}"),)


@dataclass
class GatewayUnderTest:
    gateway: Gateway
    channel: grpc.aio.Channel
    queues: queue_service_pb2_grpc.QueueServiceStub
    channels: channel_service_pb2_grpc.ChannelServiceStub
    persistables: persistable_service_pb2_grpc.PersistableServiceStub
    requests: request_service_pb2_grpc.RequestServiceStub

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.gateway.port}"


@pytest.fixture
async def gateway(redis_server: RedisServer) -> AsyncIterator[GatewayUnderTest]:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        secrets=SECRETS,
        bus=fast_settings([redis_server.url], max_message_bytes=64 * 1024),
        heartbeat_seconds=0.5,
        grace_seconds=2,
    )
    gateway = Gateway(settings)
    await gateway.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}")
    try:
        yield GatewayUnderTest(
            gateway,
            channel,
            queue_service_pb2_grpc.QueueServiceStub(channel),
            channel_service_pb2_grpc.ChannelServiceStub(channel),
            persistable_service_pb2_grpc.PersistableServiceStub(channel),
            request_service_pb2_grpc.RequestServiceStub(channel),
        )
    finally:
        await channel.close()
        await gateway.stop()


@pytest.fixture
async def peer_bus(redis_server: RedisServer, make_bus: Callable[..., Any]) -> Bus:
    """A core bus of its own on the gateway's Redis: the local peer of a test."""
    bus: Bus = await make_bus([redis_server.url])
    return bus


def error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ``google.rpc.ErrorInfo`` of a failed call."""
    status = rpc_status.from_call(error)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return info


class Stream(Generic[R]):
    """A server stream read item by item, heartbeats skipped, each read bounded in time.

    ``await stream.next()`` is the next response; ``await stream.events(n)`` the next n as
    ``(kind, value)`` pairs: ``("delivery", payload)`` or ``("state", kind)``.
    """

    def __init__(self, call: Any) -> None:
        self.call = call
        self._responses: AsyncIterator[R] = call.__aiter__()
        self.heartbeats = 0

    async def raw(self, timeout: float = 10.0) -> R:
        """The next response, heartbeat or not."""
        return await asyncio.wait_for(self._responses.__anext__(), timeout)

    async def next(self, timeout: float = 10.0) -> R:
        while True:
            response = await self.raw(timeout)
            if response.WhichOneof("event") != "heartbeat":  # type: ignore[attr-defined]
                return response
            self.heartbeats += 1

    async def events(self, n: int) -> list[tuple[str, object]]:
        return [_event(await self.next()) for _ in range(n)]

    async def rest(self) -> list[tuple[str, object]]:
        """Everything until the stream ends (with status OK)."""
        items = []
        while True:
            try:
                items.append(_event(await self.next()))
            except StopAsyncIteration:
                assert await self.call.code() is grpc.StatusCode.OK
                return items

    def cancel(self) -> None:
        self.call.cancel()


def _event(response: Any) -> tuple[str, object]:
    kind = response.WhichOneof("event")
    if kind == "delivery":
        return ("delivery", response.delivery.message.payload)
    if kind == "state":
        return ("state", response.state.kind)
    return (kind, getattr(response, kind))
