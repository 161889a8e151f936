"""A streaming Spark query in a process of its own, for the kill test: queue ``src`` ->
queue ``dst`` (micro-batches of 400 rows read in partitions of 100 ids, pushes of 50),
its checkpoint in CHECKPOINT. When it reaches the message with payload ``STALL`` it
writes file MARKER and stalls there, in the middle of a micro-batch, until it is killed.

    python -m tests.support.spark_pipe REDIS_URL CHECKPOINT STALL MARKER
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main() -> None:
    url, checkpoint, stall, marker = sys.argv[1:5]
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    from busmq.spark import local_session

    spark = local_session("busmq-pipe", master="local[2,2]")
    stall_at = stall.encode()

    def passing(payload: bytes) -> bytes:
        if payload == stall_at:
            Path(marker).write_text("stalled")
            time.sleep(3600)  # stalls the Spark task until the test kills it
        return payload

    through = F.udf(passing, BinaryType())
    query = (
        spark.readStream.format("busmq")
        .options(redis_urls=url, queues="src", max_rows_per_trigger="400", partition_size="100")
        .load()
        .select(through("payload").alias("payload"))
        .writeStream.format("busmq")
        .options(redis_urls=url, queue="dst", create="true", batch_size="50")
        .option("dedupe_seconds", "0.001")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
