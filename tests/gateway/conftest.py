from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from busmq.v1 import queue_service_pb2_grpc
from busmq_gateway import Gateway, GatewaySettings
from tests.conftest import fast_settings
from tests.support.redis_server import RedisServer

SECRETS = ("first-secret", "rotated-secret")
AUTH = (("authorization", f"Bearer {SECRETS[0]}"),)


@dataclass
class GatewayUnderTest:
    gateway: Gateway
    channel: grpc.aio.Channel
    queues: queue_service_pb2_grpc.QueueServiceStub

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
        yield GatewayUnderTest(gateway, channel, queue_service_pb2_grpc.QueueServiceStub(channel))
    finally:
        await channel.close()
        await gateway.stop()
