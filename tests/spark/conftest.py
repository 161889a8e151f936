"""Real Redis shards for the Spark tests (their SparkSession, ``spark``, is the session-wide
one of ``tests.support.readme``, shared with the README's Spark example)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")


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
