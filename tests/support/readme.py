"""Fixtures for the README's Python examples, which pytest-markdown-docs runs as tests.

A fence names what it needs (```` ```python fixture:bus ````); each fixture gives the
name the example uses a real, local counterpart: an embedded or test Redis, a Sentinel
deployment, a cluster, a TLS gateway in "DC-A". Loaded as a plugin (``-p``) so that the
README at the repository root sees them; tests under ``tests/`` keep their own ``bus``
(a closer ``conftest.py`` fixture wins).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from busmq import Bus, Request
from tests.support.certs import make_pki
from tests.support.cluster import ClusterGroup
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.sentinel import SentinelGroup

SPARK_FIXTURE = "spark"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """README examples that use Spark carry the ``spark`` mark, like the Spark tests; and
    whatever uses the Spark session runs on one pytest-xdist worker (``--dist loadgroup``),
    so that one JVM starts, not one per worker. That group (about 160 s) goes first: last
    in the order, it kept one worker busy for minutes after the other had run out."""
    for item in filter(_uses_spark, items):
        if item.get_closest_marker("markdown-docs"):
            item.add_marker(pytest.mark.spark)
        item.add_marker(pytest.mark.xdist_group(SPARK_FIXTURE))
    items.sort(key=lambda item: not _uses_spark(item))  # stable: the rest keep their order


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--dist loadgroup``, refuse the pytest and pytest-xdist pair that does not
    group: pytest 9.2's node ids make xdist 3.8's groups a silent no-op
    (pytest-dev/pytest-xdist#1386), and every worker then started its own Spark JVM."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    from importlib.metadata import version

    xdist = tuple(int(part) for part in version("pytest-xdist").split(".")[:2])
    if pytest.version_tuple[:2] >= (9, 2) and xdist <= (3, 8):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {version('pytest-xdist')} does "
            "not honour --dist loadgroup (pytest-dev/pytest-xdist#1386): install the "
            "versions pyproject.toml allows (scripts/setup.sh --dev)"
        )


def _uses_spark(item: pytest.Item) -> bool:
    return SPARK_FIXTURE in getattr(item, "fixturenames", ())


@pytest.fixture
def embedded_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No Redis configured (``Bus()`` starts the embedded one) and its data in a temp dir."""
    monkeypatch.delenv("BUSMQ_REDIS_URLS", raising=False)
    monkeypatch.setenv("BUSMQ_DATA_DIR", str(tmp_path / "redis"))
    return tmp_path / "redis"


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[Bus]:
    """A connected bus on a Redis of its own."""
    async with RedisServer(tmp_path / "redis") as server, Bus(redis_urls=(server.url,)) as b:
        yield b


@pytest.fixture
async def sentinel_url(tmp_path: Path) -> AsyncIterator[str]:
    """A Sentinel-managed master with one replica (for ``replicas=1``), and its URL."""
    async with SentinelGroup(tmp_path / "sentinel", replicas=1, sentinels=1) as group:
        yield group.url


@pytest.fixture
async def cluster_url(tmp_path: Path) -> AsyncIterator[str]:
    async with ClusterGroup(tmp_path / "cluster", masters=3) as cluster:
        yield cluster.url


@dataclass(frozen=True)
class RemoteGateway:
    url: str
    secret: str
    ca_file: Path


@pytest.fixture
async def gateway_a(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[RemoteGateway]:
    """DC-A: a Redis, a TLS gateway on it and a ``pricing`` handler; DC-B's ``Bus()``
    gets a Redis of its own (``BUSMQ_REDIS_URLS``) and its outbox in a temp dir."""
    (tmp_path / "pki").mkdir()
    ca, server, _ = make_pki(tmp_path / "pki")
    secret = "readme-example-secret-0123456789"
    async with (
        RedisServer(tmp_path / "redis-a") as redis_a,
        RedisServer(tmp_path / "redis-b") as redis_b,
        Bus(redis_urls=(redis_a.url,)) as bus_a,
    ):
        gateway = GatewayProcess(
            redis_a.url, (secret,), "--tls-cert", str(server.cert), "--tls-key", str(server.key)
        )
        await gateway.start()
        pricing = bus_a.service("pricing")
        serving = asyncio.create_task(pricing.serve(_price))
        monkeypatch.setenv("BUSMQ_REDIS_URLS", redis_b.url)
        monkeypatch.setenv("BUSMQ_DATA_DIR", str(tmp_path / "dc-b" / "redis"))
        try:
            yield RemoteGateway(f"https://{gateway.target}", secret, ca.cert)
        finally:
            try:
                pricing.stop_serving()
                await serving
            finally:
                await gateway.stop()


@pytest.fixture
async def tls_gateway(tmp_path: Path) -> AsyncIterator[RemoteGateway]:
    """A TLS gateway on a Redis of its own, and nothing of this process's event loop
    in between (for recipes that block, such as Spark's)."""
    (tmp_path / "pki").mkdir()
    ca, server, _ = make_pki(tmp_path / "pki")
    secret = "readme-example-secret-0123456789"
    async with RedisServer(tmp_path / "redis") as redis:
        gateway = GatewayProcess(
            redis.url, (secret,), "--tls-cert", str(server.cert), "--tls-key", str(server.key)
        )
        await gateway.start()
        try:
            yield RemoteGateway(f"https://{gateway.target}", secret, ca.cert)
        finally:
            await gateway.stop()


async def _price(request: Request) -> dict[str, Any]:
    return {"sku": request.data["sku"], "price": 9.5}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for every Spark test and example (the JVM starts once)."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from busmq.spark import local_session

    # local[2,2]: two threads, and a failed task is retried once (maxFailures 2).
    session = local_session(
        "busmq-tests", master="local[2,2]", **{"spark.python.worker.reuse": "true"}
    )
    yield session
    session.stop()


@pytest.fixture
async def orders_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """A Redis in ``BUSMQ_REDIS_URLS`` holding a replayable queue ``orders`` of 3 orders."""
    async with RedisServer(tmp_path / "redis") as server:
        async with Bus(redis_urls=(server.url,)) as b:
            orders = b.queue("orders")
            await orders.attach(ttl=300)
            await orders.push_batch([{"order": n} for n in range(3)])
            await orders.detach()
        monkeypatch.setenv("BUSMQ_REDIS_URLS", server.url)
        yield server.url
