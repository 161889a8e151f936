"""The HTTP listener off loopback: TLS with the gateway's certificate and the gateway's
secret (Bearer, or the password of basic auth) on every path but /healthz; refused
settings. The listener binds every interface; the test only ever connects to 127.0.0.1."""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from busmq_gateway import Gateway, GatewaySettings
from busmq_gateway.config import TlsSettings
from tests.conftest import fast_settings
from tests.support.certs import make_pki
from tests.support.redis_server import RedisServer

SECRET = "http-listener-secret-0123456789"


@pytest.fixture
async def tls_gateway(
    redis_server: RedisServer, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, Path]]:
    ca, server, _client = make_pki(tmp_path)
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        secrets=(SECRET,),
        bus=fast_settings([redis_server.url]),
        tls=TlsSettings(server.cert, server.key),
        http_listen="0.0.0.0:0",
        grace_seconds=1,
    )
    gateway = Gateway(settings)
    await gateway.start()
    try:
        yield gateway, ca.cert
    finally:
        await gateway.stop()


async def get(url: str, ca: Path, headers: dict[str, str] | None = None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(ca))
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers or {}, ssl=context) as response,
    ):
        return response.status, await response.text()


async def test_off_loopback_it_needs_tls_and_the_secret(tls_gateway: tuple[Gateway, Path]) -> None:
    gateway, ca = tls_gateway
    assert gateway.http is not None
    base = f"https://127.0.0.1:{gateway.http.port}"

    assert await get(base + "/healthz", ca) == (200, "ok\n")  # open: for load balancers
    for path in ("/metrics", "/", "/api/overview"):
        status, text = await get(base + path, ca)
        assert status == 401, path
    assert (await get(base + "/metrics", ca, {"Authorization": "Bearer wrong"}))[0] == 401

    status, text = await get(base + "/metrics", ca, {"Authorization": f"Bearer {SECRET}"})
    assert status == 200 and "busmq_shard_up" in text
    basic = base64.b64encode(f"admin:{SECRET}".encode()).decode()
    status, text = await get(base + "/", ca, {"Authorization": f"Basic {basic}"})
    assert status == 200 and "<title>busmq gateway</title>" in text

    with pytest.raises(aiohttp.ClientError):  # no plaintext on that port
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://127.0.0.1:{gateway.http.port}/healthz")


def test_settings_refuse_an_open_or_plaintext_listener_off_loopback() -> None:
    with pytest.raises(ValueError, match="needs a gateway secret"):
        GatewaySettings(listen="127.0.0.1:0", allow_no_auth=True, http_listen="0.0.0.0:8444")
    with pytest.raises(ValueError, match="plaintext"):
        GatewaySettings(listen="127.0.0.1:0", secrets=(SECRET,), http_listen="0.0.0.0:8444")
    allowed = GatewaySettings(
        listen="127.0.0.1:0", secrets=(SECRET,), http_listen="0.0.0.0:8444", allow_plaintext=True
    )
    assert allowed.http_listen == "0.0.0.0:8444"
    with pytest.raises(ValueError, match="host:port"):
        GatewaySettings(listen="127.0.0.1:0", secrets=(SECRET,), http_listen="8444")
