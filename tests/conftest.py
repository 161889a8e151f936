from __future__ import annotations

import asyncio
import gc
import os
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from busmq import Bus, BusSettings
from tests.support.redis_server import RedisServer

# Gateway processes started by tests (and the README recipes they run) get their HTTP
# listener on a free port, not the default 8444 that two of them would share.
os.environ.setdefault("BUSMQ_GATEWAY_HTTP_LISTEN", "127.0.0.1:0")


ONLY_ASYNCIO = os.environ.get("BUSMQ_TEST_LOOPS") == "asyncio"


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], Any]]:
    """Asyncio's own loop; modules marked ``also_on_uvloop`` run again on uvloop's, the
    loop many asyncio applications run on (uvicorn's default), unless
    ``BUSMQ_TEST_LOOPS=asyncio`` (the CI's second run, on the oldest Python supported)."""
    if item.get_closest_marker("also_on_uvloop") is None or ONLY_ASYNCIO:
        return {"asyncio": asyncio.new_event_loop}
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


FAST = {
    "lease_seconds": 3.0,
    "block_seconds": 0.2,
    "operation_timeout": 3.0,
    "health_interval": 0.2,
    "reconnect_backoff_max": 0.5,
}


def fast_settings(urls: list[str], **overrides: Any) -> BusSettings:
    """Settings with short leases and reads so tests observe expiry and recovery quickly."""
    return BusSettings(redis_urls=tuple(urls), **{**FAST, **overrides})


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture(params=[1, 3], ids=["1-shard", "3-shards"])
async def shard_urls(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[list[str]]:
    servers = [RedisServer(tmp_path / f"shard{i}") for i in range(request.param)]
    try:
        for server in servers:
            await server.start()
        yield [s.url for s in servers]
    finally:
        for server in servers:
            await server.stop()


@pytest.fixture
async def make_bus() -> AsyncIterator[Callable[..., Any]]:
    """``bus = await make_bus(urls, **settings)``: connected, closed after the test."""
    buses: list[Bus] = []

    async def factory(urls: list[str], **overrides: Any) -> Bus:
        bus = Bus(fast_settings(urls, **overrides))
        await bus.connect()
        buses.append(bus)
        return bus

    yield factory
    for bus in buses:
        await bus.close()


@pytest.fixture
async def bus(shard_urls: list[str], make_bus: Callable[..., Any]) -> Bus:
    result: Bus = await make_bus(shard_urls)
    return result


@pytest.fixture
def spans() -> Iterator[Any]:
    """OpenTelemetry's SDK recording in memory: the spans finished during the test."""
    from tests.support.spans import recording

    yield from recording()


@pytest.fixture
def collect_sentinel_leaks() -> Iterator[None]:
    """For tests that run buses on Sentinel shards: after the test, collect garbage with
    ResourceWarnings ignored. redis-py's asyncio Sentinel client can drop a connection to
    a Sentinel without closing it when a query in flight is cut (redis/redis-py#3201,
    #3259); collected here, where it was made, the garbage collector does not warn about
    it in whichever later test it happens to run (it once failed a Spark test so)."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
