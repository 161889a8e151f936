"""Two datacenters on one machine.

DC-A: its own ``redis-server``, a ``busmq-gateway`` process in front of it, a TCP proxy
in front of the gateway (so tests can cut the link), and a core bus on A's Redis.
DC-B: another ``redis-server`` and a bus that federates A's queues through the proxy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from busmq import Bus
from busmq.federation import FederationSettings, FederationTarget
from tests.conftest import fast_settings
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.tcp_proxy import TcpProxy

SECRET = "federation-secret"

# Short backoffs and timeouts so that cuts and restarts are noticed within a second.
FAST_LINK: dict[str, Any] = {
    "reconnect_backoff_initial": 0.05,
    "reconnect_backoff_max": 0.5,
    "connect_timeout": 1.0,
    "operation_timeout": 3.0,
}


@dataclass
class DatacenterA:
    redis: RedisServer
    gateway: GatewayProcess
    proxy: TcpProxy
    bus: Bus

    @property
    def url(self) -> str:
        """The gateway as B sees it: through the proxy."""
        return self.proxy.url


@pytest.fixture
async def dc_a(tmp_path: Path) -> AsyncIterator[DatacenterA]:
    async with RedisServer(tmp_path / "a-redis") as redis:
        gateway = GatewayProcess(redis.url, (SECRET,))
        await gateway.start()
        proxy = TcpProxy(gateway.port)
        await proxy.start()
        bus = Bus(fast_settings([redis.url]))
        await bus.connect()
        try:
            yield DatacenterA(redis, gateway, proxy, bus)
        finally:
            await bus.close()
            await proxy.stop()
            await gateway.stop()


MakeB = Callable[..., Awaitable[Bus]]


@pytest.fixture
async def make_b(tmp_path: Path, dc_a: DatacenterA) -> AsyncIterator[MakeB]:
    """``bus = await make_b(secret=..., **federation_settings)``: a DC-B bus federating
    to DC-A through the proxy, with its outbox in the test's directory. ``target``
    replaces the default target (``FederationTarget(dc_a.url, secret=secret)``)."""
    buses: list[Bus] = []
    async with RedisServer(tmp_path / "b-redis") as redis:

        async def factory(
            secret: str = SECRET, target: FederationTarget | None = None, **overrides: Any
        ) -> Bus:
            bus = Bus(fast_settings([redis.url]))
            await bus.connect()
            buses.append(bus)
            target = target or FederationTarget(dc_a.url, secret=secret)
            settings = {
                "targets": [target],
                "outbox_path": tmp_path / f"outbox-{len(buses)}.sqlite3",
                **FAST_LINK,
                **overrides,
            }
            bus.configure_federation(FederationSettings(**settings))
            return bus

        try:
            yield factory
        finally:
            for bus in buses:
                await bus.close()


@pytest.fixture
async def dc_b(make_b: MakeB) -> Bus:
    return await make_b()
