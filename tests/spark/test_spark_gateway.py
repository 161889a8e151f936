"""The busmq PySpark data source through a gateway (option ``gateway_url``): for Spark
clusters that reach the gateway but not Redis. Reads use ``BrowseQueue``; a streaming
sink pushes as an idempotent producer, so retried tasks store each row once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from busmq import Bus, Mode
from tests.conftest import fast_settings
from tests.spark.conftest import GATEWAY_SECRET as SECRET
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.spark


async def _fill(url: str, name: str, count: int) -> None:
    async with Bus(fast_settings([url])) as bus:
        queue = bus.queue(name)
        await queue.attach(ttl=600.0, auto_renew=False)
        items = [(f"m{i}", {"n": str(i)}) if i % 2 else {"i": i} for i in range(count)]
        await queue.push_batch(items)


async def _stored(url: str, name: str) -> list[bytes]:
    async with Bus(fast_settings([url])) as bus:
        queue = bus.queue(name)
        await queue.attach(ttl=600.0)
        count = await queue.count()
        async with queue.consume(Mode.REPLAY, from_id=0, max=count) as consumer:
            return [delivery.payload async for delivery in consumer]


async def test_a_batch_read_through_a_gateway(spark: Any, gateway: tuple[RedisServer, str]) -> None:
    redis, url = gateway
    await _fill(redis.url, "gw-src", 300)
    rows = (
        spark.read.format("busmq")
        .options(gateway_url=url, secret=SECRET, queues="gw-src", partition_size="100")
        .option("decode_json", "true")
        .load()
        .orderBy("id")
        .collect()
    )
    assert [r.id for r in rows] == list(range(1, 301))
    assert rows[0].json == '{"i":0}' and rows[0].kind == "json"
    assert (rows[1].payload, rows[1].kind, rows[1].headers) == (b"m1", "text", {"n": "1"})
    assert rows[1].timestamp is not None


async def test_a_streaming_pipe_through_a_gateway_stores_each_row_once(
    spark: Any, gateway: tuple[RedisServer, str], tmp_path: Path
) -> None:
    """Every task fails once after 100 rows and is retried: the sink's batches are
    numbered as a producer's, and the gateway stores each once."""
    redis, url = gateway
    await _fill(redis.url, "gw-in", 1000)
    query = (
        spark.readStream.format("busmq")
        .options(gateway_url=url, secret=SECRET, queues="gw-in", max_rows_per_trigger="400")
        .load()
        .select("payload", "headers")
        .writeStream.format("busmq")
        .options(gateway_url=url, secret=SECRET, queue="gw-out", create="true")
        .options(batch_size="50", fail_after_rows="100")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert await _stored(redis.url, "gw-out") == await _stored(redis.url, "gw-in")


async def test_a_refused_secret_fails_before_any_job(
    spark: Any, gateway: tuple[RedisServer, str]
) -> None:
    redis, url = gateway
    await _fill(redis.url, "gw-known", 1)
    reader = spark.read.format("busmq").options(gateway_url=url, queues="gw-known")
    with pytest.raises(Exception, match="UNAUTHENTICATED"):
        reader.option("secret", "not-the-secret-0123456789").load().collect()
    with pytest.raises(Exception, match="exclude each other"):
        reader.options(secret=SECRET, redis_urls=redis.url).load().collect()
    with pytest.raises(Exception, match="refusing plaintext"):
        spark.read.format("busmq").options(
            gateway_url="http://example.com:8443", secret=SECRET, queues="gw-known"
        ).load().collect()
