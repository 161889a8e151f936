"""The busmq data source on a Sentinel-managed shard and on a Redis Cluster: the Python
workers find the master through the Sentinels, or the slot's node through the cluster,
as the bus does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from busmq import Bus, Mode
from tests.conftest import fast_settings
from tests.support.cluster import ClusterGroup
from tests.support.sentinel import SentinelGroup

pytestmark = pytest.mark.spark


@pytest.mark.usefixtures("collect_sentinel_leaks")
async def test_batch_read_and_write_on_a_sentinel_shard(spark: Any, tmp_path: Path) -> None:
    async with SentinelGroup(tmp_path / "sentinel", replicas=1) as group:
        async with Bus(fast_settings([group.url])) as bus:
            source = bus.queue("orders")
            await source.attach(ttl=600.0, auto_renew=False)
            await source.push_batch([f"order {i}" for i in range(500)])

        rows = (
            spark.read.format("busmq")
            .options(redis_urls=group.url, queues="orders")
            .load()
            .orderBy("id")
            .collect()
        )
        assert [r["id"] for r in rows] == list(range(1, 501))
        assert rows[0]["payload"] == b"order 0"

        spark.createDataFrame([(f"copy {i}",) for i in range(50)], "payload string").write.format(
            "busmq"
        ).mode("append").options(
            redis_urls=group.url, queue="copies", create="true", ttl="600"
        ).save()
        async with Bus(fast_settings([group.url])) as bus:
            copies = bus.queue("copies")
            await copies.attach(ttl=600.0)
            async with copies.consume(Mode.REPLAY, from_id=0, max=50) as reader:
                got = sorted([d.data async for d in reader])
        assert got == sorted(f"copy {i}" for i in range(50))


async def test_batch_read_from_a_cluster(spark: Any, tmp_path: Path) -> None:
    names = [f"events-{i}" for i in range(6)]  # on several masters
    async with ClusterGroup(tmp_path / "cluster", masters=3) as cluster:
        async with Bus(fast_settings([cluster.url])) as bus:
            for name in names:
                queue = bus.queue(name)
                await queue.attach(ttl=600.0, auto_renew=False)
                await queue.push_batch([f"{name} {i}" for i in range(100)])
        rows = (
            spark.read.format("busmq")
            .options(redis_urls=cluster.url, queues=",".join(names))
            .load()
            .collect()
        )
    got = sorted((r["queue"], r["id"], r["payload"]) for r in rows)
    assert got == sorted(
        (name, i + 1, f"{name} {i}".encode()) for name in names for i in range(100)
    )
