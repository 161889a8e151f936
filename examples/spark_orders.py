"""Orders pipeline: busmq queue -> Spark Structured Streaming -> Parquet + busmq queue.

1. JSON order events are pushed to queue ``orders`` on the embedded Redis
   (``busmq.Bus()``; data in ``$BUSMQ_DATA_DIR``, default a temporary directory here).
2. A streaming query (``trigger(availableNow=True)``) reads them with the ``busmq`` data
   source, counts and sums the amounts per minute, and for every micro-batch writes the
   aggregates to Parquet and pushes them as JSON to queue ``order-stats``.
3. The script reads ``order-stats`` back with the busmq core and prints it.

Run (needs ``pip install 'busmq[spark]'`` and Java 17):

    .venv/bin/python examples/spark_orders.py [--orders 5000] [--out /tmp/busmq-orders]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import busmq


async def push_orders(bus: busmq.Bus, count: int) -> None:
    orders = bus.queue("orders")
    await orders.attach(ttl=3600)
    stats = bus.queue("order-stats")
    await stats.attach(ttl=3600)
    rng = random.Random(7)
    start_ms = int(time.time() * 1000) - count * 50
    events = [
        {
            "order_id": i,
            "amount": round(rng.uniform(1, 200), 2),
            "ts": start_ms + i * 50,  # one order every 50 ms: about 20 per second
        }
        for i in range(count)
    ]
    for first in range(0, count, 1000):
        await orders.push_batch(events[first : first + 1000])
    print(f"pushed {count} orders to queue 'orders'")


def run_spark(redis_url: str, out: Path) -> None:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from busmq.spark import local_session

    spark = local_session("busmq-orders", **{"spark.sql.session.timeZone": "UTC"})
    try:
        orders = (
            spark.readStream.format("busmq")
            .option("redis_urls", redis_url)
            .option("queues", "orders")
            .option("decode_json", "true")
            .load()
            .select(F.from_json("json", "order_id long, amount double, ts long").alias("o"))
            .select(
                (F.col("o.ts") / 1000).cast("timestamp").alias("at"),
                F.col("o.amount").alias("amount"),
            )
        )

        def sink(batch: DataFrame, batch_id: int) -> None:
            stats = (
                batch.groupBy(F.window("at", "1 minute").start.alias("minute"))
                .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total"))
                .withColumn("batch", F.lit(batch_id))
            )
            stats.write.mode("append").parquet(str(out / "parquet"))
            (
                stats.select(
                    F.to_json(
                        F.struct(
                            F.date_format("minute", "yyyy-MM-dd'T'HH:mm'Z'").alias("minute"),
                            "orders",
                            "total",
                            "batch",
                        )
                    ).alias("payload")
                )
                .write.format("busmq")
                .mode("append")
                .option("redis_urls", redis_url)
                .option("queue", "order-stats")
                .option("kind", "json")
                # Stable request ids: a micro-batch re-run after a crash is stored once.
                .option("write_id", "spark-orders-stats")
                .save()
            )

        query = (
            orders.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(out / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        parquet = spark.read.parquet(str(out / "parquet"))
        totals = parquet.agg(F.sum("orders").alias("orders")).collect()[0]
        print(f"parquet: {parquet.count()} per-minute rows, {totals.orders} orders in all")
    finally:
        spark.stop()


async def read_stats(bus: busmq.Bus) -> list[Any]:
    stats = bus.queue("order-stats")
    count = await stats.count()
    if not count:
        return []
    rows = []
    async with stats.consume(busmq.Mode.REPLAY, from_id=0, max=count) as consumer:
        async for delivery in consumer:
            rows.append(delivery.data)
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="busmq-orders-"))
    os.environ.setdefault("BUSMQ_DATA_DIR", str(out / "redis"))
    async with busmq.Bus() as bus:
        await push_orders(bus, args.orders)
        url = bus.shards[0].url
        # Spark blocks this thread: run it beside the event loop so the bus keeps its
        # leases on the queues renewed.
        await asyncio.to_thread(run_spark, url, out)
        for row in await read_stats(bus):
            print("order-stats:", json.dumps(row))
    print(f"output in {out}")


if __name__ == "__main__":
    asyncio.run(main())
