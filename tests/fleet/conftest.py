"""The fleet tier: three ``busmq-gateway`` processes over DC-A's Redis behind a real nginx
that spreads every call round robin, and a DC-B bus that federates through nginx's one
URL, as production runs them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from busmq import Bus
from busmq.federation import FederationSettings, FederationTarget
from tests.conftest import fast_settings
from tests.federation.conftest import FAST_LINK
from tests.support.gateway_process import GatewayProcess
from tests.support.nginx import Nginx
from tests.support.redis_server import RedisServer

SECRET = "fleet-secret-0123456789-abcdef"


@dataclass
class Fleet:
    redis: RedisServer
    gateways: list[GatewayProcess]
    nginx: Nginx
    a: Bus  # DC-A's own bus, on its Redis
    b: Bus  # DC-B's bus, federating through nginx

    @property
    def url(self) -> str:
        return self.nginx.url


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with (
        RedisServer(tmp_path / "a-redis") as redis,
        RedisServer(tmp_path / "b-redis") as b_redis,
    ):
        gateways = [GatewayProcess(redis.url, (SECRET,), "--grace-seconds", "4") for _ in range(3)]
        try:
            for gateway in gateways:
                await gateway.start()
            async with (
                Nginx(tmp_path / "nginx", [g.target for g in gateways]) as nginx,
                Bus(fast_settings([redis.url])) as a,
                Bus(fast_settings([b_redis.url])) as b,
            ):
                target = FederationTarget(nginx.url, secret=SECRET)
                outbox = tmp_path / "outbox.sqlite3"
                b.configure_federation(
                    FederationSettings(targets=[target], outbox_path=outbox, **FAST_LINK)
                )
                yield Fleet(redis, gateways, nginx, a, b)
        finally:
            for gateway in gateways:
                await gateway.stop()
