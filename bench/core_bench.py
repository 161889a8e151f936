"""busmq core benchmark: the published workload, with a raw redis-py baseline in the same run.

Workload: ``--queues`` queues (100), ``--size``-byte messages (32), producers and consumers
in this one asyncio process, against one local ``redis-server`` that the script starts on
a free loopback port (no persistence) and kills at the end.

Scenarios (``--modes``):

- ``amo``:  flood, at-most-once. One producer per queue pushes batches of ``--batch`` as
  fast as it can, but pauses while its queue's client-side backlog (sent - consumed)
  would exceed ``--window``, so consumed == pushed at the end is meaningful.
- ``alo``:  the same flood, at-least-once; each consumer acks with ``ack_upto`` every
  ``--ack-every`` deliveries.
- ``rate``: ``--rate`` msg/s in total (5,000), spread over the queues, single pushes paced
  with asyncio; at-most-once consumers. Reports end-to-end latency.

Each message carries ``time.perf_counter_ns()`` at send (and a per-queue sequence number)
in its first 16 bytes; latency is measured when the consumer gets it. The first
``--warmup`` seconds of each run are not measured.

Baseline (``--impl baseline``): the same workload with plain redis-py (hiredis parser,
pipelines, multi-element commands):

- amo  (``--amo-baseline list``): ``RPUSH key v1..vN`` / ``BLMPOP 1 key LEFT COUNT n``;
  (``stream``): ``XADD`` pipeline / ``XREADGROUP NOACK`` + ``XDEL`` of the previous batch.
- alo: ``XADD`` pipeline / ``XREADGROUP COUNT n`` with ``XACK`` + ``XDEL`` of the previous
  batch pipelined in front of the next read.
- rate: single ``RPUSH`` (or ``XADD``) per message / the amo consumer.

Usage::

    .venv/bin/python bench/core_bench.py                 # 20 s per run, everything
    .venv/bin/python bench/core_bench.py --seconds 3     # quick check
    .venv/bin/python bench/core_bench.py --impl busmq --modes amo --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import itertools
import json
import math
import os
import statistics
import struct
import sys
import time
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

import ordering_bench  # bench/ is sys.path[0]
import schema_bench
from _gc import GcPauses  # bench/ is sys.path[0]
from _redis import (
    LocalRedis,
    RedisTarget,
    local_redis,
    machine_busy_seconds,
    machine_steal_seconds,
)
from busmq import Bus, BusError, BusSettings, Consumer, Mode, Queue

try:  # absent from revisions older than durability levels (bench/ab.py runs those too)
    from busmq import Durability
except ImportError:  # pragma: no cover
    Durability = None  # type: ignore[assignment,misc]

STAMP = struct.Struct("<qq")  # send time (perf_counter_ns), per-queue sequence number
SCENARIOS = ("amo", "alo", "rate", "ordered", "schema")
IMPLS = ("busmq", "baseline", "node")
NODE_DIR = Path(__file__).resolve().parent / "node"  # the Node.js busmq (npm ci there)
TITLES = {
    "amo": "at-most-once flood",
    "alo": "at-least-once flood",
    "rate": "at-most-once @ fixed rate",
}  # ordered: bench/ordering_bench.py prints its own table
TARGETS = {"amo": 100_000.0, "alo": 50_000.0}  # consumed/s
TARGET_RATE_P99_MS = 1.5
GROUP = "bench"

Push = Callable[[list[bytes]], Awaitable[Any]]


# -- configuration and shared state ---------------------------------------------------


@dataclass(frozen=True)
class Config:
    seconds: float
    warmup: float
    queues: int
    size: int
    rate: float
    batch: int
    prefetch: int
    window: int
    ack_every: int
    amo_baseline: str
    drain_timeout: float
    max_connections: int
    bus_settings: tuple[tuple[str, float], ...]
    durability: str = "async"
    name_prefix: str = "bench"  # queue names: <prefix>-<scenario>-<i>
    request_ids: bool = False  # busmq: every push carries a fresh request id
    producer: bool = False  # busmq: every push carries its producer's next sequence
    tracing: str = "off"  # busmq: off, api (propagation, no SDK), sdk (spans recorded)
    pace: str = "exact"  # the rate run's producers wake each at its own time, or "ms"


@dataclass(slots=True)
class Lane:
    """One queue's client-side counters."""

    index: int
    sent: int = 0  # handed to a push (in flight included)
    pushed: int = 0  # push confirmed
    consumed: int = 0
    last_seq: int = -1
    disorder: int = 0  # sequence numbers seen out of order (or twice)
    waiting: bool = False
    room: asyncio.Event = field(default_factory=asyncio.Event)
    last_id: int = 0  # busmq alo: last delivered id
    unacked: int = 0  # busmq alo: delivered since the last ack
    pending_ids: list[bytes] = field(default_factory=list)  # baseline streams: to ack/del


class Run:
    """State shared by the producers and consumers of one run."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.lanes = [Lane(i) for i in range(config.queues)]
        self.latencies = array("q")
        self.pace_lag = array("q")
        self.recording = False
        self.running = True
        self.closing = False  # baseline consumers: leave the loop
        self.errors = 0
        self.consumer_errors = 0
        self.low_water = config.window // 2
        self.pad = bytes(max(0, config.size - STAMP.size))
        self.seq = [0] * config.queues

    def payloads(self, lane: Lane, count: int) -> list[bytes]:
        now = time.perf_counter_ns()
        seq = self.seq[lane.index]
        self.seq[lane.index] = seq + count
        pack, pad = STAMP.pack, self.pad
        return [pack(now, seq + i) + pad for i in range(count)]

    def take(self, lane: Lane, payload: bytes) -> None:
        """Account for one consumed message (called once per message by every consumer)."""
        now = time.perf_counter_ns()
        sent, seq = STAMP.unpack_from(payload)
        if self.recording:
            self.latencies.append(now - sent)
        if seq <= lane.last_seq:
            lane.disorder += 1
        lane.last_seq = seq
        lane.consumed += 1
        if lane.waiting and lane.sent - lane.consumed <= self.low_water:
            lane.waiting = False
            lane.room.set()

    async def wait_room(self, lane: Lane, count: int) -> None:
        window = self.config.window
        while self.running and lane.sent - lane.consumed + count > window:
            lane.waiting = True
            lane.room.clear()
            await lane.room.wait()

    async def consumer_error(self, lane: Lane, exc: BaseException) -> None:
        """A consumer's read failed: count it, say so (the first few), and go on."""
        self.consumer_errors += 1
        if self.consumer_errors <= 3:
            print(f"  read error on lane {lane.index}: {exc!r}", file=sys.stderr)
        await asyncio.sleep(0.01)

    def stop(self) -> None:
        self.running = False
        for lane in self.lanes:
            lane.room.set()

    def totals(self) -> tuple[int, int, int]:
        sent = pushed = consumed = 0
        for lane in self.lanes:
            sent += lane.sent
            pushed += lane.pushed
            consumed += lane.consumed
        return sent, pushed, consumed


@dataclass
class Result:
    impl: str
    scenario: str
    seconds: float = 0.0
    pushed: int = 0
    consumed: int = 0
    pushed_per_s: float = 0.0
    consumed_per_s: float = 0.0
    backlog_end: int = 0
    backlog_mean: float = 0.0
    backlog_max: int = 0
    backlog_slope_per_s: float = 0.0
    backlog_flat: bool = False
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    p999_ms: float = math.nan
    max_ms: float = math.nan
    samples: int = 0
    pace_lag_p99_ms: float = math.nan
    drained: bool = False
    lost: int = 0
    disorder: int = 0
    errors: int = 0
    read_errors: int = 0
    stored_after: int = -1
    client_cpu: float = 0.0  # cores used by this process during the measured window
    redis_cpu: float = 0.0  # cores used by redis-server during the measured window
    other_cpu: float = 0.0  # cores used by everything else on the machine meanwhile
    steal_cpu: float = 0.0  # cores the hypervisor gave to other guests meanwhile
    gc_full: float = math.nan  # this process's full garbage collections meanwhile
    gc_longest_ms: float = math.nan  # and the longest pause of any collection
    client_sys_share: float = 0.0  # fraction of this process's CPU spent in the kernel
    settle_seconds: float = 0.0  # extra warm-up until the backlog stopped moving
    notes: list[str] = field(default_factory=list)


# -- generic drivers --------------------------------------------------------------------


async def flood_producer(run: Run, lane: Lane, push: Push) -> None:
    batch = run.config.batch
    while run.running:
        await run.wait_room(lane, batch)
        if not run.running:
            return
        payloads = run.payloads(lane, batch)
        lane.sent += batch
        try:
            await push(payloads)
        except (BusError, aioredis.RedisError) as exc:
            lane.sent -= batch
            run.errors += 1
            if run.errors <= 3:
                print(f"  push error on lane {lane.index}: {exc!r}", file=sys.stderr)
            await asyncio.sleep(0.01)
            continue
        lane.pushed += batch


def wake_time(due: float, pace: str) -> float:
    """When a producer whose next push is due at ``due`` wakes. ``ms``: on the first
    millisecond tick at or after it, as the Node.js side's ``setTimeout`` fires (libuv's
    loop keeps time in milliseconds), so that both sides are offered the same bunches of
    pushes; ``exact``: at ``due`` itself, each push alone (only this side can pace so)."""
    return math.ceil(due * 1000) / 1000 if pace == "ms" else due


async def paced_producer(run: Run, lane: Lane, push: Push, start: float) -> None:
    """Single pushes at ``rate / queues`` msg/s, phase-shifted per queue."""
    loop = asyncio.get_running_loop()
    interval = run.config.queues / run.config.rate
    due = start + interval * lane.index / run.config.queues
    pace = run.config.pace
    while run.running:
        delay = wake_time(due, pace) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if not run.running:
            return
        if run.recording:
            run.pace_lag.append(int((loop.time() - due) * 1e9))
        payloads = run.payloads(lane, 1)
        lane.sent += 1
        try:
            await push(payloads)
        except (BusError, aioredis.RedisError) as exc:
            lane.sent -= 1
            run.errors += 1
            if run.errors <= 3:
                print(f"  push error on lane {lane.index}: {exc!r}", file=sys.stderr)
        else:
            lane.pushed += 1
        due += interval


def _slope(points: Sequence[tuple[float, int]]) -> float:
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(b for _, b in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mx) * (b - my) for t, b in points) / var


async def settle(run: Run, limit: float = 10.0) -> float:
    """Wait (up to ``limit`` s) until the backlog stops moving: over the last second it
    varied by at most 5% of its cap. Returns the seconds waited."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    cap = run.config.queues * run.config.window
    history: list[int] = []
    while loop.time() - start < limit:
        _, pushed, consumed = run.totals()
        history.append(pushed - consumed)
        recent = history[-5:]
        if len(recent) == 5 and max(recent) - min(recent) <= 0.05 * cap:
            break
        await asyncio.sleep(0.25)
    return loop.time() - start


async def wait_quiet(threshold: float, limit: float) -> float:
    """Wait (up to ``limit`` s) until the rest of the machine uses under ``threshold``
    cores over one second (other people's tests and builds skew every figure)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        busy0, own0 = machine_busy_seconds(), time.process_time()
        await asyncio.sleep(1.0)
        other = machine_busy_seconds() - busy0 - (time.process_time() - own0)
        if other < threshold or loop.time() - start >= limit:
            return other


async def measure(run: Run, server: RedisTarget, result: Result) -> None:
    """Let the run warm up, then measure for ``seconds``; stops the producers at the end."""
    config = run.config
    await asyncio.sleep(config.warmup)
    result.settle_seconds = await settle(run)
    _, pushed0, consumed0 = run.totals()
    cpu0, rcpu0, busy0 = time.process_time(), server.cpu_seconds(), machine_busy_seconds()
    sys0, steal0 = os.times().system, machine_steal_seconds()
    pauses = GcPauses().start()
    t0 = time.perf_counter()
    run.recording = True
    samples: list[tuple[float, int]] = []
    while (elapsed := time.perf_counter() - t0) < config.seconds:
        await asyncio.sleep(min(0.25, config.seconds - elapsed))
        _, pushed, consumed = run.totals()
        samples.append((time.perf_counter() - t0, pushed - consumed))
    run.recording = False
    run.stop()
    t1 = time.perf_counter()
    pauses.stop()
    result.gc_full, result.gc_longest_ms = pauses.full, pauses.longest_ms
    _, pushed1, consumed1 = run.totals()
    cpu1, rcpu1, busy1 = time.process_time(), server.cpu_seconds(), machine_busy_seconds()
    sys1, steal1 = os.times().system, machine_steal_seconds()
    span = t1 - t0
    result.seconds = span
    result.pushed = pushed1 - pushed0
    result.consumed = consumed1 - consumed0
    result.pushed_per_s = result.pushed / span
    result.consumed_per_s = result.consumed / span
    result.backlog_end = pushed1 - consumed1
    result.client_cpu = (cpu1 - cpu0) / span
    result.client_sys_share = (sys1 - sys0) / (cpu1 - cpu0) if cpu1 > cpu0 else 0.0
    result.redis_cpu = (rcpu1 - rcpu0) / span
    result.other_cpu = max(0.0, (busy1 - busy0) / span - result.client_cpu - result.redis_cpu)
    result.steal_cpu = (steal1 - steal0) / span
    if samples:
        backlogs = [b for _, b in samples]
        result.backlog_mean = sum(backlogs) / len(backlogs)
        result.backlog_max = max(backlogs)
        result.backlog_slope_per_s = _slope(samples)
        # Flat: the fitted growth over the whole window stays under 5% of the cap (or of
        # one batch per queue, whichever is larger).
        cap = config.queues * config.window
        growth = result.backlog_slope_per_s * span
        result.backlog_flat = growth <= max(0.05 * cap, config.queues * config.batch)


async def drain(run: Run, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if all(lane.consumed >= lane.pushed for lane in run.lanes):
            return True
        await asyncio.sleep(0.01)
    return False


def finish(run: Run, result: Result) -> None:
    lat = sorted(run.latencies)
    result.samples = len(lat)
    if lat:
        result.p50_ms = _pct(lat, 0.50) / 1e6
        result.p99_ms = _pct(lat, 0.99) / 1e6
        result.p999_ms = _pct(lat, 0.999) / 1e6
        result.max_ms = lat[-1] / 1e6
    if run.pace_lag:
        result.pace_lag_p99_ms = _pct(sorted(run.pace_lag), 0.99) / 1e6
    result.lost = sum(max(0, lane.pushed - lane.consumed) for lane in run.lanes)
    result.disorder = sum(lane.disorder for lane in run.lanes)
    result.errors = run.errors
    result.read_errors = run.consumer_errors
    extra = sum(max(0, lane.consumed - lane.pushed) for lane in run.lanes)
    if extra:
        result.notes.append(f"{extra} messages consumed more than once or not confirmed")


def phase(message: str) -> None:
    """Progress line on stderr (``--verbose``)."""
    if VERBOSE:
        print(f"    [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


VERBOSE = False


def _pct(ordered: Sequence[int], q: float) -> float:
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


@contextlib.asynccontextmanager
async def _guard(result: Result, what: str, seconds: float) -> AsyncIterator[None]:
    """Bound a phase that should be quick; a hang becomes a note instead of a stuck run."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        result.notes.append(f"{what} timed out after {seconds:g}s")


async def _cancel(tasks: Sequence[asyncio.Task[Any]], attempts: int = 50) -> None:
    """Cancel tasks and wait for them, cancelling again any that swallowed it (a redis-py
    call can turn a cancellation into a timeout that a retry loop then absorbs)."""
    for _ in range(attempts):
        live = [task for task in tasks if not task.done()]
        if not live:
            break
        for task in live:
            task.cancel()
        await asyncio.wait(live, timeout=0.2)
    done = [task for task in tasks if task.done()]
    await asyncio.gather(*done, return_exceptions=True)


async def _reap(tasks: Sequence[asyncio.Task[Any]], result: Result, timeout: float = 15.0) -> None:
    """Await tasks that should be ending (cancelling any still running after ``timeout``)
    and record any failure."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    if pending:
        result.notes.append(f"{len(pending)} tasks still running after {timeout:g}s: cancelled")
        await _cancel(list(pending))
    for outcome in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            result.notes.append(f"task failed: {outcome!r}")


# -- busmq ----------------------------------------------------------------------------


async def busmq_consume(run: Run, lane: Lane, consumer: Consumer, ack_every: int) -> None:
    take = run.take
    if consumer.mode is Mode.AT_LEAST_ONCE:
        async for delivery in consumer:
            take(lane, delivery.payload)
            lane.last_id = delivery.id
            lane.unacked += 1
            if lane.unacked >= ack_every:
                lane.unacked = 0
                await consumer.ack_upto(delivery.id)
    else:
        async for delivery in consumer:
            take(lane, delivery.payload)


def _recording_provider() -> Any:
    """An OpenTelemetry SDK provider that samples and records every span and exports
    them in batches to nowhere: the cost an application with tracing on pays, without
    an exporter's network."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    return provider


async def run_busmq(config: Config, server: RedisTarget, scenario: str) -> Result:
    result = Result("busmq", scenario)
    run = Run(config)
    overrides: dict[str, Any] = dict(config.bus_settings)
    if config.bus_settings:
        result.notes.append(f"BusSettings overrides: {overrides}")
    if config.max_connections:
        overrides["max_connections"] = config.max_connections
        result.notes.append(f"BusSettings(max_connections={config.max_connections})")
    if config.durability != "async":
        overrides["durability"] = Durability.parse(config.durability)
        result.notes.append(f"durability {config.durability}")
    provider = None
    if config.tracing != "off":
        overrides["tracing"] = True
        result.notes.append(f"tracing {config.tracing}")
        provider = _recording_provider() if config.tracing == "sdk" else None
    # Only what is in use is passed: ab.py runs this script against trees whose Bus
    # predates tracing (a feature the older tree lacks is left out, not a crash).
    bus_options: dict[str, Any] = {} if provider is None else {"tracer_provider": provider}
    bus = Bus(BusSettings(redis_urls=(server.url,), **overrides), **bus_options)
    await bus.connect()
    consumers: list[Consumer] = []
    ctasks: list[asyncio.Task[None]] = []
    ptasks: list[asyncio.Task[None]] = []
    try:
        queues: list[Queue] = [
            bus.queue(f"{config.name_prefix}-{scenario}-{i}") for i in range(config.queues)
        ]
        await asyncio.gather(*(q.attach() for q in queues))
        mode = Mode.AT_LEAST_ONCE if scenario == "alo" else Mode.AT_MOST_ONCE
        consumers = [q.consume(mode, prefetch=config.prefetch) for q in queues]
        await asyncio.gather(*(c.start() for c in consumers))
        ctasks = [
            asyncio.create_task(busmq_consume(run, lane, c, config.ack_every))
            for lane, c in zip(run.lanes, consumers, strict=True)
        ]
        start = asyncio.get_running_loop().time()
        for lane, queue in zip(run.lanes, queues, strict=True):
            push = (
                _with_request_ids(queue)
                if config.request_ids
                else _with_producer(queue)
                if config.producer
                else queue.push_batch
            )
            coro = (
                paced_producer(run, lane, push, start)
                if scenario == "rate"
                else flood_producer(run, lane, push)
            )
            ptasks.append(asyncio.create_task(coro))
        await measure(run, server, result)
        async with _guard(result, "shutdown", config.drain_timeout + 60):
            phase("measured")
            await _reap(ptasks, result)
            phase("producers stopped")
            result.drained = await drain(run, config.drain_timeout)
            phase(f"drained={result.drained}")
            if scenario == "alo":
                await asyncio.gather(
                    *(
                        c.ack_upto(lane.last_id)
                        for lane, c in zip(run.lanes, consumers, strict=True)
                        if lane.unacked
                    )
                )
            await asyncio.gather(*(c.close() for c in consumers))
            await _reap(ctasks, result)
            result.stored_after = sum(await asyncio.gather(*(q.count() for q in queues)))
    finally:
        await _cancel(ptasks + ctasks)
        async with _guard(result, "bus.close()", 30):
            await bus.close()
    finish(run, result)
    return result


# -- raw redis-py baseline ------------------------------------------------------------------


def _clients(server: LocalRedis, queues: int) -> tuple[aioredis.Redis, aioredis.Redis]:
    """A pool for commands and one for blocking reads, like busmq's shard."""
    size = 2 * queues + 16
    client = aioredis.Redis(host="127.0.0.1", port=server.port, max_connections=size)
    blocking = aioredis.Redis(host="127.0.0.1", port=server.port, max_connections=size)
    return client, blocking


async def list_consume(run: Run, lane: Lane, client: aioredis.Redis, key: str) -> None:
    count = run.config.prefetch
    take = run.take
    while not run.closing:
        try:
            reply = await client.blmpop(1, 1, key, direction="LEFT", count=count)
        except aioredis.RedisError as exc:
            await run.consumer_error(lane, exc)
            continue
        if reply:
            payloads: list[bytes] = reply[1]  # type: ignore[assignment]
            for payload in payloads:
                take(lane, payload)


async def stream_consume(
    run: Run, lane: Lane, client: aioredis.Redis, key: str, *, noack: bool
) -> None:
    """XREADGROUP batches; the previous batch is acked/deleted in the same round trip."""
    count = run.config.prefetch
    take = run.take
    consumer = f"c{lane.index}"
    while not run.closing:
        pipe = client.pipeline(transaction=False)
        ids = lane.pending_ids
        if ids:
            if not noack:
                pipe.xack(key, GROUP, *ids)
            pipe.xdel(key, *ids)
        pipe.xreadgroup(GROUP, consumer, {key: ">"}, count=count, block=1000, noack=noack)
        try:
            replies = await pipe.execute()
        except aioredis.RedisError as exc:
            await run.consumer_error(lane, exc)
            continue
        lane.pending_ids = []
        reply = replies[-1]
        if not reply:
            continue
        entries = reply[0][1]
        lane.pending_ids = [entry_id for entry_id, _ in entries]
        for _, fields in entries:
            take(lane, fields[b"p"])


def _with_request_ids(queue: Queue) -> Push:
    """``queue.push_batch`` with a fresh request id per push, as an automatic one would
    be: what deduplication costs (a ``SET ... PX`` per push in Redis, the id here)."""
    prefix = os.urandom(8).hex()
    numbers = itertools.count()

    async def push(payloads: list[bytes]) -> Any:
        return await queue.push_batch(payloads, request_id=f"{prefix}-{next(numbers)}")

    return push


def _with_producer(queue: Queue) -> Push:
    """``queue.push_batch`` as an idempotent producer: one producer per queue, each push
    numbered by the next sequence."""
    numbers = itertools.count(1)

    async def push(payloads: list[bytes]) -> Any:
        return await queue.push_batch(payloads, producer="bench", sequence=next(numbers))

    return push


def _list_push(client: aioredis.Redis, key: str) -> Push:
    async def push(payloads: list[bytes]) -> Any:
        return await client.rpush(key, *payloads)

    return push


def _stream_push(client: aioredis.Redis, key: str) -> Push:
    async def push(payloads: list[bytes]) -> Any:
        if len(payloads) == 1:
            return await client.xadd(key, {"p": payloads[0]})
        pipe = client.pipeline(transaction=False)
        for payload in payloads:
            pipe.xadd(key, {"p": payload})
        return await pipe.execute()

    return push


async def run_node(config: Config, server: LocalRedis, scenario: str) -> Result:
    """The fixed-rate run on the Node.js busmq (``bench/node/rate.js``, reliable mode: every
    message acked), against the same Redis; its figures come from that process."""
    result = Result("node", scenario)
    if scenario != "rate":
        result.notes.append("node busmq: fixed-rate run only")
        return result
    if not (NODE_DIR / "node_modules" / "busmq").is_dir():
        result.notes.append("node busmq not installed: (cd bench/node && npm ci)")
        return result
    command = [
        "node", str(NODE_DIR / "rate.js"), "--redis", server.url,
        "--queues", str(config.queues), "--rate", str(config.rate),
        "--seconds", str(config.seconds), "--warmup", str(config.warmup),
        "--size", str(config.size),
    ]  # fmt: skip
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    rcpu0 = busy0 = steal0 = 0.0
    figures: dict[str, float] = {}
    async for raw in process.stdout:
        line = raw.decode().strip()
        if line == "measuring":
            rcpu0, busy0 = server.cpu_seconds(), machine_busy_seconds()
            steal0 = machine_steal_seconds()
        elif line.startswith("{"):
            figures = json.loads(line)
            seconds = figures["seconds"]
            result.redis_cpu = (server.cpu_seconds() - rcpu0) / seconds
            busy = (machine_busy_seconds() - busy0) / seconds
            result.other_cpu = max(0.0, busy - result.redis_cpu - figures["client_cpu"])
            result.steal_cpu = (machine_steal_seconds() - steal0) / seconds
    await process.wait()
    if not figures:
        result.notes.append(f"node busmq failed (exit {process.returncode})")
        return result
    result.seconds = figures["seconds"]
    result.consumed = int(figures["consumed"])
    result.pushed = result.consumed
    result.pushed_per_s = result.consumed_per_s = figures["consumed"] / figures["seconds"]
    result.p50_ms, result.p99_ms = figures["p50_ms"], figures["p99_ms"]
    result.p999_ms = figures["p999_ms"]
    result.max_ms = figures.get("max_ms", math.nan)
    result.client_cpu, result.client_sys_share = figures["client_cpu"], figures["client_sys_share"]
    result.samples = result.consumed
    result.drained = True
    result.notes.append("node busmq 3.1.0, reliable mode (one EVALSHA per pop, ack per message)")
    return result


async def run_baseline(config: Config, server: LocalRedis, scenario: str) -> Result:
    result = Result("baseline", scenario)
    run = Run(config)
    client, blocking = _clients(server, config.queues)
    keys = [f"raw:{scenario}:{i}" for i in range(config.queues)]
    use_stream = scenario == "alo" or config.amo_baseline == "stream"
    result.notes.append(
        "XADD pipeline / XREADGROUP" + (" + XACK/XDEL" if scenario == "alo" else " NOACK + XDEL")
        if use_stream
        else "RPUSH / BLMPOP"
    )
    ctasks: list[asyncio.Task[None]] = []
    ptasks: list[asyncio.Task[None]] = []
    try:
        await client.delete(*keys)
        if use_stream:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.xgroup_create(key, GROUP, id="$", mkstream=True)
            await pipe.execute()
        for lane, key in zip(run.lanes, keys, strict=True):
            if use_stream:
                noack = scenario != "alo"
                consume = stream_consume(run, lane, blocking, key, noack=noack)
            else:
                consume = list_consume(run, lane, blocking, key)
            ctasks.append(asyncio.create_task(consume))
        await asyncio.sleep(0.05)  # let the consumers block first
        start = asyncio.get_running_loop().time()
        for lane, key in zip(run.lanes, keys, strict=True):
            push = _stream_push(client, key) if use_stream else _list_push(client, key)
            coro = (
                paced_producer(run, lane, push, start)
                if scenario == "rate"
                else flood_producer(run, lane, push)
            )
            ptasks.append(asyncio.create_task(coro))
        await measure(run, server, result)
        async with _guard(result, "shutdown", config.drain_timeout + 60):
            phase("measured")
            await _reap(ptasks, result)
            phase("producers stopped")
            result.drained = await drain(run, config.drain_timeout)
            phase(f"drained={result.drained}")
            run.closing = True
            await _cancel(ctasks)
            if use_stream:
                pipe = client.pipeline(transaction=False)
                for lane, key in zip(run.lanes, keys, strict=True):
                    if lane.pending_ids:
                        pipe.xack(key, GROUP, *lane.pending_ids)
                        pipe.xdel(key, *lane.pending_ids)
                await pipe.execute()
                pipe = client.pipeline(transaction=False)
                for key in keys:
                    pipe.xlen(key)
            else:
                pipe = client.pipeline(transaction=False)
                for key in keys:
                    pipe.llen(key)
            result.stored_after = sum(await pipe.execute())
            await client.delete(*keys)
    finally:
        await _cancel(ptasks + ctasks)
        async with _guard(result, "closing clients", 30):
            await client.aclose()
            await blocking.aclose()
    finish(run, result)
    return result


# -- reporting ------------------------------------------------------------------------------


def _fmt(value: float, digits: int = 0) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b) or b == 0:
        return "-"
    ratio = a / b
    return f"{ratio:.2f}x" if ratio < 1000 else ">999x"


def _target(scenario: str, metric: str, r: Result) -> str:
    if metric == "consumed/s" and scenario in TARGETS:
        goal = TARGETS[scenario]
        ok = r.consumed_per_s >= goal and r.drained and r.backlog_flat and r.lost == 0
        return f">= {goal:,.0f}: {'PASS' if ok else 'FAIL'}"
    if metric == "p99 ms" and scenario == "rate":
        ok = r.p99_ms <= TARGET_RATE_P99_MS
        return f"<= {TARGET_RATE_P99_MS}: {'PASS' if ok else 'FAIL'}"
    return ""


ROWS: list[tuple[str, Callable[[Result], float], int, bool]] = [
    # label, value, decimals, whether busmq/baseline is a meaningful ratio
    ("pushed/s", lambda r: r.pushed_per_s, 0, True),
    ("consumed/s", lambda r: r.consumed_per_s, 0, True),
    ("backlog at end", lambda r: float(r.backlog_end), 0, False),
    ("backlog mean", lambda r: r.backlog_mean, 0, False),
    ("backlog slope /s", lambda r: r.backlog_slope_per_s, 0, False),
    ("p50 ms", lambda r: r.p50_ms, 3, True),
    ("p99 ms", lambda r: r.p99_ms, 3, True),
    ("p99.9 ms", lambda r: r.p999_ms, 3, True),
    ("max ms", lambda r: r.max_ms, 3, True),
    ("client CPU (cores)", lambda r: r.client_cpu, 2, False),
    ("redis CPU (cores)", lambda r: r.redis_cpu, 2, False),
    ("other CPU (cores)", lambda r: r.other_cpu, 2, False),
    ("steal (cores)", lambda r: r.steal_cpu, 2, False),
    ("client gc longest ms", lambda r: r.gc_longest_ms, 2, False),
    ("client gc full", lambda r: r.gc_full, 0, False),
    ("client CPU us/msg", lambda r: _per_msg(r.client_cpu, r), 1, True),
    ("client kernel share", lambda r: r.client_sys_share, 2, False),
    ("redis CPU us/msg", lambda r: _per_msg(r.redis_cpu, r), 1, True),
]


def _per_msg(cores: float, r: Result) -> float:
    """CPU microseconds per consumed message: robust to other load on the machine."""
    return cores * 1e6 / r.consumed_per_s if r.consumed_per_s else math.nan


def report(config: Config, results: list[Result]) -> str:
    by_key = {(r.impl, r.scenario): r for r in results}
    lines = [
        f"busmq core benchmark: {config.queues} queues, {config.size}-byte messages, "
        f"{config.seconds:g} s measured per run after {config.warmup:g} s warm-up",
        f"flood: push batches of {config.batch}, window {config.window}/queue, "
        f"prefetch {config.prefetch}, alo ack every {config.ack_every}; "
        f"rate: {config.rate:,.0f} msg/s single pushes, "
        + ("on millisecond ticks" if config.pace == "ms" else "each at its own time"),
        "",
    ]
    with_node = any(r.impl == "node" and r.samples for r in results)
    header = f"{'scenario':<27}{'metric':<20}{'busmq':>12}{'baseline':>12}{'ratio':>9}"
    if with_node:
        header += f"{'node busmq':>12}{'ratio':>9}"
    header += "  target"
    lines += [header, "-" * len(header)]
    scenarios = dict.fromkeys(r.scenario for r in results)
    for scenario in scenarios:
        mine, base = by_key.get(("busmq", scenario)), by_key.get(("baseline", scenario))
        node = by_key.get(("node", scenario))
        title = TITLES[scenario]
        rows = ROWS if scenario != "rate" else [*ROWS, ("pace lag p99 ms", _lag, 3, False)]
        for metric, get, digits, comparable in rows:
            a = get(mine) if mine else math.nan
            b = get(base) if base else math.nan
            target = _target(scenario, metric, mine) if mine else ""
            line = (
                f"{title:<27}{metric:<20}{_fmt(a, digits):>12}{_fmt(b, digits):>12}"
                f"{_ratio(a, b) if comparable else '':>9}"
            )
            if with_node:
                n = get(node) if node and node.samples else math.nan
                line += f"{_fmt(n, digits):>12}{_ratio(a, n) if comparable else '':>9}"
            lines.append(f"{line}  {target}")
            title = ""
        for r in (mine, base, node):
            if r is None:
                continue
            if r.impl == "node":
                lines += [f"{'':<27}{'node busmq':<20} {note}" for note in r.notes]
                continue
            lines.append(
                f"{'':<27}{r.impl + ' checks':<20} flat={'yes' if r.backlog_flat else 'NO'}"
                f" drained={'yes' if r.drained else 'NO'} lost={r.lost}"
                f" disorder={r.disorder} errors={r.errors}/{r.read_errors}"
                f" stored_after={r.stored_after}"
                f" samples={r.samples:,} settle={r.settle_seconds:.1f}s"
            )
            for note in r.notes:
                lines.append(f"{'':<47}{note}")
        lines.append("")
    return "\n".join(lines)


def _lag(r: Result) -> float:
    return r.pace_lag_p99_ms


# -- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before")
    p.add_argument("--queues", type=int, default=100)
    p.add_argument("--size", type=int, default=32, help="message bytes (>= 16)")
    p.add_argument("--rate", type=float, default=5000.0, help="total msg/s of the rate run")
    p.add_argument(
        "--modes",
        default="amo,alo,rate",
        help="comma list of amo, alo, rate, ordered (ordering per key: bench/ordering_bench.py "
        "with --seconds, --warmup, --rate, --batch and --prefetch of this run), schema "
        "(bench/schema_bench.py with --seconds, --warmup and --batch)",
    )
    p.add_argument(
        "--rate-rounds", type=int, default=3, help="interleaved rounds of the fixed rate (medians)"
    )
    p.add_argument("--impl", default="busmq,baseline", help="comma list of busmq, baseline")
    p.add_argument("--batch", type=int, default=100, help="flood push batch size")
    p.add_argument("--prefetch", type=int, default=100, help="consumer read batch size")
    p.add_argument("--window", type=int, default=1000, help="flood per-queue backlog cap")
    p.add_argument("--ack-every", type=int, default=0, help="alo ack batch (0: = prefetch)")
    p.add_argument("--amo-baseline", choices=("list", "stream"), default="list")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument(
        "--request-ids", action="store_true", help="busmq: a fresh request id on every push"
    )
    p.add_argument(
        "--producer",
        action="store_true",
        help="busmq: every push is an idempotent producer's next sequence",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=0,
        help="BusSettings.max_connections for busmq (0: busmq's default)",
    )
    p.add_argument("--uvloop", action="store_true", help="run on uvloop (if installed)")
    p.add_argument(
        "--tracing",
        choices=("off", "api", "sdk"),
        default="off",
        help="busmq: trace propagation off, on with the API only, or on with the SDK recording",
    )
    p.add_argument(
        "--pace",
        choices=("exact", "ms"),
        default="exact",
        help="the rate run's producers wake each at its own due time, or on millisecond "
        "ticks as the Node.js side's timers do (the same bunches offered to both)",
    )
    p.add_argument(
        "--bus-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a numeric BusSettings field for busmq runs (repeatable)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to this long for the rest of the machine to go quiet",
    )
    ordering_bench.add_arguments(p, prefix="ordered-")
    schema_bench.add_arguments(p, prefix="schema-")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--render", type=Path, help="only print the table of a saved --json file")
    p.add_argument("--verbose", action="store_true", help="progress lines on stderr")
    args = p.parse_args(argv)
    if args.size < STAMP.size:
        p.error(f"--size must be at least {STAMP.size}")
    if args.window < args.batch:
        p.error("--window must be at least --batch")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.impl = [i.strip() for i in args.impl.split(",") if i.strip()]
    if not set(args.modes) <= set(SCENARIOS) or not args.modes:
        p.error(f"--modes: choose from {', '.join(SCENARIOS)}")
    if not set(args.impl) <= set(IMPLS) or not args.impl:
        p.error(f"--impl: choose from {', '.join(IMPLS)}")
    return args


def _setting(item: str) -> tuple[str, float]:
    name, _, value = item.partition("=")
    return name.strip(), float(value)


async def run_one(
    args: argparse.Namespace, config: Config, server: LocalRedis, impl: str, scenario: str
) -> Result:
    if args.quiet_wait:
        other = await wait_quiet(0.15, args.quiet_wait)
        print(f"  other load {other:.2f} cores", file=sys.stderr)
    print(f"running {impl} {scenario} ...", file=sys.stderr, flush=True)
    runner = {"busmq": run_busmq, "baseline": run_baseline, "node": run_node}[impl]
    result = await runner(config, server, scenario)
    print(
        f"  {result.consumed_per_s:,.0f} consumed/s, p50 {result.p50_ms:.3f}, p99"
        f" {result.p99_ms:.3f}, p99.9 {result.p999_ms:.3f}, max {result.max_ms:.3f} ms",
        file=sys.stderr,
        flush=True,
    )
    return result


def median_result(runs: list[Result]) -> Result:
    """One run's result, or each figure's median over rounds (with each round's p99
    and p99.9 in the notes, so a single unstable number shows as one)."""
    if len(runs) == 1:
        return runs[0]
    merged = copy.deepcopy(runs[0])
    for item in dataclasses.fields(Result):
        values = [getattr(r, item.name) for r in runs]
        if all(type(v) in (int, float) for v in values):
            setattr(merged, item.name, type(values[0])(statistics.median(values)))
        elif all(type(v) is bool for v in values):
            setattr(merged, item.name, all(values))
    each = ", ".join(
        f"{name} " + " ".join(f"{getattr(r, attr):.3f}" for r in runs)
        for name, attr in (("p99", "p99_ms"), ("p99.9", "p999_ms"), ("max", "max_ms"))
    )
    each += ", steal " + " ".join(f"{r.steal_cpu:.2f}" for r in runs)
    each += ", client gc ms " + " ".join(f"{r.gc_longest_ms:.2f}" for r in runs)
    merged.notes.append(f"medians of {len(runs)} interleaved rounds; each round: {each}")
    return merged


async def main_async(args: argparse.Namespace) -> list[Result]:
    config = Config(
        seconds=args.seconds,
        warmup=args.warmup,
        queues=args.queues,
        size=args.size,
        rate=args.rate,
        batch=args.batch,
        prefetch=args.prefetch,
        window=args.window,
        ack_every=args.ack_every or args.prefetch,
        amo_baseline=args.amo_baseline,
        drain_timeout=args.drain_timeout,
        max_connections=args.max_connections,
        bus_settings=tuple(_setting(item) for item in args.bus_setting),
        request_ids=args.request_ids,
        producer=args.producer,
        tracing=args.tracing,
        pace=args.pace,
    )
    results: list[Result] = []
    own: list[str] = []  # the tables of the scenarios with a workload of their own
    with local_redis() as server:
        print(f"redis-server pid {server.pid} on port {server.port}", file=sys.stderr)
        for scenario in args.modes:
            if scenario in ("ordered", "schema"):
                print(f"running busmq {scenario} ...", file=sys.stderr, flush=True)
                if scenario == "ordered":
                    own.append(await ordering_bench.run(server.url, ordering_arguments(args)))
                else:
                    own.append(await schema_bench.run(server.url, schema_arguments(args)))
                continue
            rounds: dict[str, list[Result]] = {}
            # A fixed rate's tail varies from run to run: interleaved rounds, medians.
            for _ in range(args.rate_rounds if scenario == "rate" else 1):
                for impl in args.impl:
                    result = await run_one(args, config, server, impl, scenario)
                    rounds.setdefault(impl, []).append(result)
            results += [median_result(runs) for runs in rounds.values()]
            if args.json:  # after every scenario, so a crash or hang loses little
                _save(args.json, config, results)
    if results:
        print(report(config, results))
    for table in own:
        print(table)
    return results


def schema_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """This run's options as ``schema_bench`` takes them."""
    return argparse.Namespace(
        seconds=args.seconds,
        warmup=args.warmup,
        batch=args.batch,
        messages=args.schema_messages,
        consumers=args.schema_consumers,
        rounds=args.schema_rounds,
    )


def ordering_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """This run's options as ``ordering_bench`` takes them (its backlog cap: 200 batches)."""
    return argparse.Namespace(
        seconds=args.seconds,
        warmup=args.warmup,
        rate=args.rate,
        batch=args.batch,
        prefetch=args.prefetch,
        window=200 * args.batch,
        keys=args.ordered_keys,
        consumers=args.ordered_consumers,
        producers=args.ordered_producers,
        drain=args.ordered_drain,
        rounds=args.ordered_rounds,
    )


def _save(path: Path, config: Config, results: list[Result]) -> None:
    payload = {"config": asdict(config), "results": [asdict(r) for r in results]}
    path.write_text(json.dumps(payload, indent=2, default=str))


def main(argv: Sequence[str] | None = None) -> int:
    global VERBOSE
    args = parse_args(argv)
    VERBOSE = args.verbose
    if args.render:
        saved = json.loads(args.render.read_text())
        fields: dict[str, Any] = dict(saved["config"])
        fields["bus_settings"] = tuple(map(tuple, fields.get("bus_settings", ())))
        fields.setdefault("max_connections", 0)
        fields.setdefault("pace", "exact")  # saved before --pace
        config = Config(**fields)
        print(report(config, [Result(**r) for r in saved["results"]]))
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        if args.uvloop:
            import uvloop  # type: ignore[import-not-found,unused-ignore]

            uvloop.run(main_async(args))
        else:
            asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
