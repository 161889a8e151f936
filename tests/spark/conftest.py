"""One SparkSession for all Spark tests (the JVM starts once), and real Redis shards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.redis_server import RedisServer

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from busmq.spark import local_session

    # local[2,2]: two threads, and a failed task is retried once (maxFailures 2).
    session = local_session(
        "busmq-tests", master="local[2,2]", **{"spark.python.worker.reuse": "true"}
    )
    yield session
    session.stop()


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
