"""The busmq PySpark data source against real Redis shards placed by the bus."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from busmq import Bus, Mode, Retention
from busmq.keys import QueueKeys
from busmq.shard import shard_identity
from busmq.sharding import rank
from busmq.spark._core import locate
from tests.conftest import fast_settings
from tests.support.processes import ROOT
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.spark


def spread_over_shards(urls: list[str], count: int) -> list[str]:
    """``count`` queue names that rendezvous hashing places on more than one shard
    (placement depends on the shards' ports, which are chosen at random)."""
    identities = [shard_identity(u) for u in urls]
    home = {name: rank(identities, name)[0] for name in (f"events-{i}" for i in range(100))}
    names = list(home)[:count]
    if len({home[n] for n in names}) == 1:
        names[-1] = next(n for n in home if home[n] != home[names[0]])
    return names


def _value(queue: str, i: int) -> Any:
    """A mix of payload kinds and headers, reproducible from (queue, i)."""
    if i % 3 == 0:
        return (f"{queue}:{i}".encode(), None)
    if i % 3 == 1:
        return (f"text {queue} {i}", {"n": str(i)})
    return ({"queue": queue, "i": i}, None)


async def _push(urls: list[str], queues: list[str], per_queue: list[range]) -> dict[str, list[int]]:
    """Push ``per_queue[k]`` values to ``queues[k]`` through the bus; returns the ids."""
    ids: dict[str, list[int]] = {}
    async with Bus(fast_settings(urls, default_ttl=600.0)) as bus:
        for name, values in zip(queues, per_queue, strict=True):
            queue = bus.queue(name)
            await queue.attach(ttl=600.0, auto_renew=False)
            items = [_value(name, i) for i in values]
            ids[name] = []
            for start in range(0, len(items), 1000):
                ids[name] += await queue.push_batch(items[start : start + 1000])
    return ids


def _expected_payload(queue: str, i: int) -> bytes:
    value, _ = _value(queue, i)
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    import json

    return json.dumps(value, separators=(",", ":")).encode()


def _reader(spark: Any, urls: list[str], queues: list[str], **options: Any) -> Any:
    reader = spark.read.format("busmq").option("redis_urls", ",".join(urls))
    reader = reader.option("queues", ",".join(queues))
    for key, val in options.items():
        reader = reader.option(key, str(val))
    return reader


async def test_batch_read_across_three_shards(spark: Any, shards: list[RedisServer]) -> None:
    urls = [s.url for s in shards]
    queues = spread_over_shards(urls, 5)
    per_queue = [range(2000)] * len(queues)  # 10,000 messages
    ids = await _push(urls, queues, per_queue)
    # The bus spread the queues over more than one shard.
    assert len({locate(urls, q)[0] for q in queues}) > 1

    df = _reader(spark, urls, queues, partition_size=700, decode_json="true").load()
    assert df.rdd.getNumPartitions() == len(queues) * 3  # 2000 ids in chunks of 700
    rows = df.collect()
    assert len(rows) == 10_000
    got: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        got[row.queue].append(row)
    for name in queues:
        assert [r.id for r in got[name]] == ids[name] == list(range(1, 2001))
        assert [r.payload for r in got[name]] == [_expected_payload(name, i) for i in range(2000)]
        assert [r.kind for r in got[name][:3]] == ["bytes", "text", "json"]
        assert got[name][1].headers == {"n": "1"}
        assert got[name][2].json == f'{{"queue":"{name}","i":2}}'

    subset = _reader(spark, urls, queues[:1], start_id=10, end_id=19).load().collect()
    assert [r.id for r in subset] == list(range(10, 20))


def _stream_once(spark: Any, urls: list[str], out: Path, checkpoint: Path) -> list[int]:
    """One availableNow run; returns the input rows of each micro-batch."""
    stream = (
        spark.readStream.format("busmq")
        .option("redis_urls", ",".join(urls))
        .option("queues", "waves-a,waves-b")
        .option("max_rows_per_trigger", "700")
        .load()
    )
    query = (
        stream.select("queue", "id", "payload")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(60)
    assert query.exception() is None
    query.stop()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


async def test_streaming_resumes_from_checkpoint_exactly_once(
    spark: Any, shards: list[RedisServer], tmp_path: Path
) -> None:
    urls = [s.url for s in shards]
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    queues = ["waves-a", "waves-b"]
    pushed: dict[str, list[int]] = defaultdict(list)
    for wave in range(3):
        ids = await _push(urls, queues, [range(wave * 600, (wave + 1) * 600), range(300)])
        for name in queues:
            pushed[name] += ids[name]
        if wave == 1:
            continue  # stopped after wave 0; waves 1 and 2 are read after restarts
        # Each availableNow run is a new start from the checkpoint.
        batches = await asyncio.to_thread(_stream_once, spark, urls, out, checkpoint)
        # max_rows_per_trigger=700 bounds every micro-batch.
        assert max(batches) <= 700 and len(batches) >= 2, batches
    rows = spark.read.parquet(str(out)).collect()
    seen = sorted((r.queue, r.id) for r in rows)
    assert len(seen) == len(set(seen)), "a message was written twice"
    assert seen == sorted((q, i) for q in queues for i in pushed[q])
    by_id = {(r.queue, r.id): r.payload for r in rows}
    assert by_id[("waves-a", 1)] == _expected_payload("waves-a", 0)
    assert by_id[("waves-a", 1800)] == _expected_payload("waves-a", 1799)


def _stream_kept(spark: Any, urls: list[str], out: Path, checkpoint: Path, **options: str) -> Any:
    """One availableNow run of queue ``kept`` into Parquet; returns the ended query."""
    reader = spark.readStream.format("busmq").option("redis_urls", ",".join(urls))
    for name, value in {"queues": "kept", **options}.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .select("queue", "id", "payload")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(Exception):  # the query's own failure is in exception()
        query.awaitTermination(120)
    return query


async def test_a_query_fails_when_retention_dropped_what_it_had_not_read(
    spark: Any, shards: list[RedisServer], tmp_path: Path
) -> None:
    """Ids the retention trims while a query is stopped are data loss: the restarted
    query fails and says so; with fail_on_data_loss=false it skips them and goes on."""
    urls = [s.url for s in shards]
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    async with Bus(fast_settings(urls, default_ttl=600.0)) as bus:
        kept = bus.queue("kept")
        await kept.attach(ttl=600.0, retention=Retention(max_length=500), auto_renew=False)
        await kept.push_batch([b"%d" % i for i in range(400)])
        assert _stream_kept(spark, urls, out, checkpoint).exception() is None
        await kept.push_batch([b"%d" % i for i in range(400, 1400)])  # ids 401..900 trimmed
        failed = _stream_kept(spark, urls, out, checkpoint)
        assert failed.exception() is not None
        assert "ids 401 to 900 of queue 'kept'" in str(failed.exception())
        assert "fail_on_data_loss=false" in str(failed.exception())
        skipped = _stream_kept(spark, urls, out, checkpoint, fail_on_data_loss="false")
        assert skipped.exception() is None
    ids = sorted(r.id for r in spark.read.parquet(str(out)).collect())
    assert ids == list(range(1, 401)) + list(range(901, 1401))


async def test_write_with_task_retry_does_not_duplicate(
    spark: Any, shards: list[RedisServer]
) -> None:
    urls = [s.url for s in shards]
    from pyspark.sql import functions as F

    df = spark.range(0, 10_000, numPartitions=2).select(
        F.concat(F.lit("m"), F.col("id").cast("string")).alias("payload"),
        F.create_map(F.lit("i"), F.col("id").cast("string")).alias("headers"),
    )
    writer = (
        df.write.format("busmq")
        .mode("append")
        .option("redis_urls", ",".join(urls))
        .option("queue", "written")
        .option("create", "true")
        .option("ttl", "600")
        .option("fail_after_rows", "1200")  # attempt 0 of each task fails after 1500 rows
    )
    writer.save()  # blocking: no bus is connected meanwhile

    async with Bus(fast_settings(urls)) as bus:
        queue = bus.queue("written")
        await queue.attach(ttl=600.0)
        assert await queue.count() == 10_000
        got = []
        async with queue.consume(Mode.AT_MOST_ONCE, max=10_000, prefetch=1000) as consumer:
            async for delivery in consumer:
                got.append((delivery.id, delivery.data, dict(delivery.headers)))
    assert [g[0] for g in got] == list(range(1, 10_001))
    assert sorted(int(g[1][1:]) for g in got) == list(range(10_000))
    assert all(g[2] == {"i": g[1][1:]} for g in got)
    # Each task's rows keep their order: partition 0 holds 0..4999, partition 1 the rest.
    low = [int(g[1][1:]) for g in got if int(g[1][1:]) < 5000]
    assert low == sorted(low)


async def test_bad_options_fail_before_any_job(spark: Any, shards: list[RedisServer]) -> None:
    urls = [s.url for s in shards]
    await _push(urls, ["known"], [range(3)])
    good = ",".join(urls)
    sc = spark.sparkContext
    sc.setJobGroup("bad-options", "bad options")
    cases: list[tuple[dict[str, str], str]] = [
        ({"redis_urls": good, "queues": "missing"}, "unknown queue 'missing'"),
        ({"redis_urls": "http://127.0.0.1:1", "queues": "known"}, "unsupported Redis URL"),
        ({"queues": "known"}, "'redis_urls' is required"),
        ({"redis_urls": good, "queues": "bad name!"}, "option 'queues'"),
        ({"redis_urls": good, "queues": "known", "start_id": "x"}, "must be an integer"),
        (
            {"redis_urls": good, "queues": "known", "start_id": "5", "end_id": "2"},
            "greater than 'end_id'",
        ),
        ({"redis_urls": good, "queues": "known", "decode_json": "maybe"}, "true or false"),
    ]
    for options, message in cases:
        with pytest.raises(Exception, match=message):
            spark.read.format("busmq").options(**options).load().collect()
    with pytest.raises(Exception, match="max_rows_per_trigger"):
        spark.readStream.format("busmq").options(
            redis_urls=good, queues="known", max_rows_per_trigger="0"
        ).load()
    with pytest.raises(Exception, match="'starting' must be one of"):
        spark.readStream.format("busmq").options(
            redis_urls=good, queues="known", starting="middle"
        ).load()
    # An unknown queue in a stream: the query fails as it starts, before any batch.
    query = (
        spark.readStream.format("busmq")
        .options(redis_urls=good, queues="missing")
        .load()
        .writeStream.format("memory")
        .queryName("never")
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="unknown queue 'missing'"):
        query.awaitTermination(60)
    df = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception, match="attach it first, or set option create=true"):
        df.write.format("busmq").mode("append").options(redis_urls=good, queue="nope").save()
    with pytest.raises(Exception, match="only appends"):
        df.write.format("busmq").mode("overwrite").options(redis_urls=good, queue="known").save()
    no_payload = spark.createDataFrame([(1,)], "n int")
    with pytest.raises(Exception, match="needs a 'payload' column"):
        no_payload.write.format("busmq").mode("append").options(
            redis_urls=good, queue="known"
        ).save()
    assert sc.statusTracker().getJobIdsForGroup("bad-options") == []
    sc.setLocalProperty("spark.jobGroup.id", None)


def _pipe_once(spark: Any, urls: list[str], checkpoint: Path, **sink_options: str) -> None:
    """Stream queue ``src`` into ``dst`` until caught up (``sink_options`` added)."""
    writer = (
        spark.readStream.format("busmq")
        .option("redis_urls", ",".join(urls))
        .option("queues", "src")
        .option("max_rows_per_trigger", "400")
        .load()
        .select("payload", "headers")
        .writeStream.format("busmq")
        .option("redis_urls", ",".join(urls))
        .option("queue", "dst")
        .option("create", "true")
        .option("checkpointLocation", str(checkpoint))
    )
    for name, value in sink_options.items():
        writer = writer.option(name, value)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None


def _pipe_with_retries(spark: Any, urls: list[str], checkpoint: Path, **options: str) -> None:
    """The pipe with every task failing once after 100 rows (in push batches of 50) and
    retried, and request ids remembered for a millisecond only."""
    retried = {"batch_size": "50", "fail_after_rows": "100", "dedupe_seconds": "0.001"}
    _pipe_once(spark, urls, checkpoint, **retried, **options)


async def test_a_streaming_sink_stores_each_row_once_with_no_dedupe_window(
    spark: Any, shards: list[RedisServer], tmp_path: Path
) -> None:
    """A streaming sink pushes as one idempotent producer per query and partition: a
    retried task's batches are duplicates however long after. The same pipe keyed by
    request ids (``write_id``) stores the retried batches again once the 1 ms window
    has passed, which shows what the sequences save."""
    urls = [s.url for s in shards]
    await _push(urls, ["src"], [range(1000)])
    _pipe_with_retries(spark, urls, tmp_path / "sequenced")
    async with Bus(fast_settings(urls)) as bus:
        dst = bus.queue("dst")
        await dst.attach(ttl=600.0)
        assert await dst.count() == 1000
        got = []
        async with dst.consume(Mode.REPLAY, from_id=0, max=1000) as consumer:
            async for delivery in consumer:
                got.append(delivery.payload)
        assert sorted(got) == sorted(_expected_payload("src", i) for i in range(1000))
        url, _ = locate(urls, "dst")
        client = aioredis.from_url(url)
        try:
            fields = await client.hkeys(QueueKeys("dst").info)
        finally:
            await client.aclose()
        assert any(f.startswith(b"P:spark:") for f in fields)
        await dst.flush()
    _pipe_with_retries(spark, urls, tmp_path / "by-request-id", write_id="pipe")
    async with Bus(fast_settings(urls)) as bus:
        dst = bus.queue("dst")
        await dst.attach(ttl=600.0)
        assert await dst.count() > 1000


async def test_streaming_sink_queue_to_queue(
    spark: Any, shards: list[RedisServer], tmp_path: Path
) -> None:
    urls = [s.url for s in shards]
    await _push(urls, ["src"], [range(1000)])
    _pipe_once(spark, urls, tmp_path / "checkpoint")
    _pipe_once(spark, urls, tmp_path / "checkpoint")  # restarted, nothing new: no copies
    async with Bus(fast_settings(urls)) as bus:
        dst = bus.queue("dst")
        await dst.attach(ttl=600.0)
        assert await dst.count() == 1000
        got = []
        async with dst.consume(Mode.REPLAY, from_id=0, max=1000) as consumer:
            async for delivery in consumer:
                got.append((delivery.payload, dict(delivery.headers)))
    assert [g[0] for g in got] == [_expected_payload("src", i) for i in range(1000)]
    assert got[1][1] == {"n": "1"}


@pytest.mark.slow
async def test_a_streaming_query_killed_mid_batch_and_restarted_stores_each_row_once(
    spark: Any, shards: list[RedisServer], tmp_path: Path
) -> None:
    """The query runs in a process of its own (``tests/support/spark_pipe.py``), its
    micro-batches of 400 ids read in four partitions; it stalls on message 1,001, the
    first of the third partition of its third micro-batch, once the first two (or
    three) partitions of that micro-batch are pushed (two task slots); the process
    group (driver, JVM, Python workers) is SIGKILLed there. The query restarted from its
    checkpoint with the same partitioning runs the micro-batch again, with the same
    producer sequences: every row is stored once."""
    url = shards[0].url
    await _push([url], ["src"], [range(2000)])
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "stalled"
    stall = _expected_payload("src", 1000).decode()
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.spark_pipe", url, str(checkpoint), stall, str(marker),
        cwd=ROOT, start_new_session=True, stdout=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT / "core")},
    )  # fmt: skip
    try:
        await eventually(marker.exists, timeout=120, interval=0.1, what="the query stalled")
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        await child.wait()
    async with Bus(fast_settings([url])) as bus:
        dst = bus.queue("dst")
        await dst.attach(ttl=600.0)
        at_kill = await dst.count()
    assert 900 <= at_kill <= 1100, f"{at_kill} stored when killed: not mid micro-batch"
    query = (
        spark.readStream.format("busmq")
        .options(redis_urls=url, queues="src", max_rows_per_trigger="400", partition_size="100")
        .load()
        .select("payload")
        .writeStream.format("busmq")
        .options(redis_urls=url, queue="dst", create="true", batch_size="50")
        .option("dedupe_seconds", "0.001")  # request ids would not help: sequences do
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    async with Bus(fast_settings([url])) as bus:
        dst = bus.queue("dst")
        await dst.attach(ttl=600.0)
        async with dst.consume(Mode.REPLAY, from_id=0, max=2000) as consumer:
            got = [delivery.payload async for delivery in consumer]
        assert await dst.count() == 2000
    # Each row once; partitions of a micro-batch are pushed side by side, so not in order.
    assert sorted(got) == sorted(_expected_payload("src", i) for i in range(2000))
    print(f"\nkilled with {at_kill} of 2000 rows stored; after the restart: 2000, each once")
