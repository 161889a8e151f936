"""PySpark integration: the ``busmq`` data source (needs ``pip install 'busmq[spark]'``).

    from busmq.spark import register
    register(spark)
    df = (spark.read.format("busmq")
          .option("redis_urls", "redis://a:6379,redis://b:6379")
          .option("queues", "orders,refunds").load())

Columns: ``queue`` string, ``id`` long, ``payload`` binary, ``kind`` string
(``bytes``/``text``/``json``), ``headers`` map<string,string>, ``timestamp`` timestamp,
and ``json`` string (the payload text of JSON messages) with ``decode_json=true``.

Where the queues are (every read and write takes one of the two):
    redis_urls      comma-separated shard URLs, exactly the bus's list (placement is the
                    bus's rendezvous hashing, probing for queues that already exist)
    gateway_url     a busmq gateway (``https://host:port``; ``http://`` to loopback, or
                    with ``allow_plaintext=true``), for Spark clusters that cannot reach
                    Redis; with ``secret`` and, for TLS, ``root_ca_file``,
                    ``client_cert_file``, ``client_key_file``, ``server_name`` (the
                    files are read in the driver). Request ids are then remembered for
                    the gateway's ``BUSMQ_DEDUPE_SECONDS``.
Read options (batch and streaming):
    queues          comma-separated queue names; each must exist
    decode_json     add the ``json`` column (default false)
    partition_size  ids per Spark partition (default 100000)
Batch only:
    start_id, end_id  inclusive id range (default: everything stored)
Streaming only (offsets are ``{queue: last id read}``):
    starting              ``earliest`` (default, from id 1) or ``latest`` (new messages only)
    max_rows_per_trigger  at most this many ids per micro-batch over all queues (10000)
    fail_on_data_loss     a streaming read fails when the queue's retention dropped ids
                          the query had not read yet (true); false skips them, logged
Write options (batch and streaming; columns ``payload`` binary/string, optional ``headers``):
    queue                 the target queue; it must exist unless ``create=true``
    create, ttl           attach (create) the queue with a lease of ``ttl`` s (600)
    kind                  ``auto`` (binary -> bytes, string -> text), ``bytes``, ``text``, ``json``
    batch_size            messages per push (500), each with an idempotent request id
    dedupe_seconds        how long request ids are remembered (600, as BusSettings); a
                          streaming sink numbers its pushes as an idempotent producer
                          per query and partition instead, with no time window (keep
                          ``batch_size`` and the reader's ``partition_size`` when the
                          query is restarted: the numbers depend on them)
    max_message_bytes     per-message limit (1 MiB, as BusSettings)
    write_id              stable id of this write in request ids (default: the streaming
                          query id for a streaming sink, else drawn per write); give one
                          in ``foreachBatch`` so a re-run micro-batch is stored once
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from .source import BusDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BusDataSource", "local_session", "register"]


def register(spark: SparkSession) -> None:
    """Make ``format("busmq")`` available on ``spark``."""
    spark.dataSource.register(BusDataSource)


def local_session(app_name: str, master: str = "local[2]", **config: str) -> SparkSession:
    """A loopback-only local SparkSession with ``busmq`` registered: workers run this
    interpreter, no UI, 1 GiB driver, 2 shuffle partitions (``config`` adds or overrides
    Spark settings). For examples, tests and benchmarks on one machine."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": "2",
        **config,
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
