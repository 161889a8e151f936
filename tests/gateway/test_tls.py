"""TLS and mutual TLS on the gateway, and the container health check over TLS."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import pytest

from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc
from busmq_gateway import Gateway, GatewaySettings
from busmq_gateway.config import TlsSettings
from tests.conftest import fast_settings
from tests.support.certs import make_pki
from tests.support.redis_server import RedisServer

AUTH = (("authorization", "Bearer tls-secret-0123456789"),)


async def start(redis_server: RedisServer, tls: TlsSettings) -> Gateway:
    gateway = Gateway(
        GatewaySettings(
            listen="127.0.0.1:0",
            secrets=("tls-secret-0123456789",),
            tls=tls,
            bus=fast_settings([redis_server.url]),
        )
    )
    await gateway.start()
    return gateway


async def attach(channel: grpc.aio.Channel) -> str:
    stub = queue_service_pb2_grpc.QueueServiceStub(channel)
    reply = await stub.AttachQueue(pb.AttachQueueRequest(queue="tls"), metadata=AUTH, timeout=5)
    return str(reply.attachment_id)


async def test_tls_serves_verified_clients_and_refuses_plaintext(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    ca, server, _ = make_pki(tmp_path)
    gateway = await start(redis_server, TlsSettings(server.cert, server.key))
    target = f"127.0.0.1:{gateway.port}"
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert.read_bytes())
        async with grpc.aio.secure_channel(target, credentials) as channel:
            assert await attach(channel)
        async with grpc.aio.insecure_channel(target) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await attach(plain)
            assert error.value.code() is grpc.StatusCode.UNAVAILABLE
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "busmq_gateway.healthcheck", target,
            env={"BUSMQ_GATEWAY_TLS_CA": str(ca.cert), "PATH": ""},
        )  # fmt: skip
        assert await process.wait() == 0
    finally:
        await gateway.stop()


async def test_mutual_tls_requires_a_client_certificate(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    ca, server, client = make_pki(tmp_path)
    # Paths as str, as a config loader gives them, are taken as a Path is.
    gateway = await start(redis_server, TlsSettings(str(server.cert), str(server.key), ca.cert))  # type: ignore[arg-type]
    target = f"127.0.0.1:{gateway.port}"
    try:
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=ca.cert.read_bytes(),
            private_key=client.key.read_bytes(),
            certificate_chain=client.cert.read_bytes(),
        )
        async with grpc.aio.secure_channel(target, with_cert) as channel:
            assert await attach(channel)
        without = grpc.ssl_channel_credentials(root_certificates=ca.cert.read_bytes())
        async with grpc.aio.secure_channel(target, without) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await attach(channel)
            assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        await gateway.stop()
