"""Spark data source throughput: batch read and one streaming micro-batch of N messages.

Pushes N messages (100-byte payloads, with the core's ``push_batch``) to a fresh
``redis-server`` on a free loopback port, then times, with a no-op sink so only the
source is measured:

- a batch read: ``spark.read.format("busmq") ... .write.format("noop")``;
- a streaming query with ``trigger(availableNow=True)`` and ``max_rows_per_trigger=N``,
  i.e. one micro-batch of N messages (query start included).

    .venv/bin/python bench/spark_bench.py [--messages 1000000] [--partition-size 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.redis_server import RedisServer

from busmq import Bus, BusSettings


async def push(url: str, count: int) -> float:
    payload = b"x" * 100
    async with Bus(BusSettings(redis_urls=(url,), default_ttl=3600)) as bus:
        queue = bus.queue("bench")
        await queue.attach(ttl=3600)
        started = time.perf_counter()
        for first in range(0, count, 1000):
            await queue.push_batch([payload] * min(1000, count - first))
        return time.perf_counter() - started


def spark_runs(url: str, count: int, partition_size: int, work: Path) -> tuple[float, float]:
    from busmq.spark import local_session

    spark = local_session("busmq-bench")
    try:
        options = {"redis_urls": url, "queues": "bench", "partition_size": str(partition_size)}
        # Warm-up: the first job starts the Python workers.
        spark.read.format("busmq").options(**options, end_id="10").load().collect()

        started = time.perf_counter()
        spark.read.format("busmq").options(**options).load().write.format("noop").mode(
            "overwrite"
        ).save()
        batch = time.perf_counter() - started

        started = time.perf_counter()
        query = (
            spark.readStream.format("busmq")
            .options(**options, max_rows_per_trigger=str(count))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        streaming = time.perf_counter() - started
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        assert rows == count, f"streamed {rows} rows, expected {count}"
        return batch, streaming
    finally:
        spark.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partition-size", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="busmq-spark-bench-") as tmp:
        async with RedisServer(Path(tmp) / "redis", appendonly=False) as server:
            pushed = await push(server.url, args.messages)
            print(
                f"push_batch: {args.messages:,} messages in {pushed:.1f} s "
                f"({args.messages / pushed:,.0f} msg/s)"
            )
            batch, streaming = await asyncio.to_thread(
                spark_runs, server.url, args.messages, args.partition_size, Path(tmp)
            )
    n = args.messages
    print(f"batch read:         {n:,} rows in {batch:.1f} s ({n / batch:,.0f} rows/s)")
    print(f"streaming (1 batch): {n:,} rows in {streaming:.1f} s ({n / streaming:,.0f} rows/s)")


if __name__ == "__main__":
    asyncio.run(main())
