"""Two datacenters on one machine.

DC-A: its own ``redis-server``, a ``busmq-gateway`` process in front of it, a TCP proxy
in front of the gateway (so tests can cut the link), and a core bus on A's Redis.
DC-B: another ``redis-server`` and a bus that federates A's queues through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from busmq import Bus
from busmq.federation import FederationSettings, FederationTarget, Link
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
async def dc_a(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[DatacenterA]:
    """DC-A; a test module's ``GATEWAY_ENV`` (a dict) is added to its gateway's
    environment (e.g. a short ``BUSMQ_DEDUPE_SECONDS``)."""
    async with datacenter_a(tmp_path, getattr(request.module, "GATEWAY_ENV", None)) as dc:
        yield dc


@contextlib.asynccontextmanager
async def datacenter_a(
    tmp_path: Path, gateway_env: dict[str, str] | None = None
) -> AsyncIterator[DatacenterA]:
    """DC-A's Redis, gateway (with ``gateway_env`` added to its environment), proxy
    and bus, torn down on exit."""
    async with RedisServer(tmp_path / "a-redis") as redis:
        gateway = GatewayProcess(redis.url, (SECRET,), env=gateway_env)
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


class CallCounter:
    """Counts the calls made through a link's stubs, by method name (``Push``,
    ``PushMany``, ...): installed with ``counter.install(link)``. While ``held`` is
    cleared, push calls wait before they start (so that tests can keep calls under way)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        self.held = asyncio.Event()
        self.held.set()
        self._monkeypatch = monkeypatch

    def install(self, link: Link) -> None:
        stub_of = link.stub

        def counting_stub(kind: type[Any] | None = None) -> Any:
            return _CountingStub(stub_of(kind), self)

        self._monkeypatch.setattr(link, "stub", counting_stub)


class _CountingStub:
    def __init__(self, stub: Any, counter: CallCounter) -> None:
        self._stub = stub
        self._counter = counter

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        counter = self._counter

        def call(*args: Any, **kwargs: Any) -> Any:
            counter.calls[name] += 1
            return method(*args, **kwargs)

        async def held_call(*args: Any, **kwargs: Any) -> Any:
            counter.calls[name] += 1
            await counter.held.wait()
            return await method(*args, **kwargs)

        return held_call if name in ("Push", "PushMany") else call


@pytest.fixture
def call_counter(monkeypatch: pytest.MonkeyPatch) -> CallCounter:
    return CallCounter(monkeypatch)
