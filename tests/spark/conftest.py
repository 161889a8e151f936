"""Real Redis shards for the Spark tests (their SparkSession, ``spark``, is the session-wide
one of ``tests.support.readme``, shared with the README's Spark example)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

GATEWAY_SECRET = "spark-gateway-secret-0123456789"


@pytest.fixture
async def shards(tmp_path: Path) -> AsyncIterator[list[RedisServer]]:
    servers = [RedisServer(tmp_path / f"shard{i}", appendonly=False) for i in range(3)]
    try:
        for server in servers:
            await server.start()
        yield servers
    finally:
        for server in servers:
            await server.stop()


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, str]]:
    """A Redis and a gateway over it (secret :data:`GATEWAY_SECRET`): the Redis and the
    gateway's URL, for writers and readers with ``gateway_url``."""
    async with RedisServer(tmp_path / "redis", appendonly=False) as redis:
        process = GatewayProcess(redis.url, (GATEWAY_SECRET,))
        await process.start()
        try:
            yield redis, f"http://{process.target}"
        finally:
            await process.stop()
