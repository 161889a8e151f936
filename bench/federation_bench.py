"""busmq federation benchmark: push -> consume through a federation link, next to the same
workload direct on the core, in one run.

Two "datacenters" on this machine: A is a ``redis-server`` plus a ``busmq-gateway``
process; B is another ``redis-server`` and a bus in this process that federates A's
queues over one link (``--pool`` warm channels). The direct runs use a core bus on A's
Redis, in this same process.

Runs:
- flood: ``--queues`` queues, ``--size``-byte messages; one producer per queue pushes
  batches of ``--batch`` and keeps at most ``--window`` messages in flight (so consumed ==
  pushed is meaningful); at-most-once consumers (``--prefetch``). Throughput and
  end-to-end latency.
- rate: ``--rate`` msg/s of single-message pushes over 10 queues: end-to-end latency;
  and the same at ``--low-rate`` (500), to see the link's own latency when the gateway
  is not near saturation.
- outbox: ``--outbox-messages`` pushed while the link is cut (a TCP proxy in front of
  the gateway), then the link restored: append rate into the outbox and drain rate.

Each payload starts with ``time.perf_counter_ns()`` at send; latency is taken when the
consumer gets it. Starts its own redis-servers (free loopback ports, no persistence)
and gateway, and stops them at the end.

    .venv/bin/python bench/federation_bench.py                # 20 s per run
    .venv/bin/python bench/federation_bench.py --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _flow import Figures, Lanes, payloads, percentile, settle, write_json  # bench/ is sys.path[0]
from _redis import free_port, local_redis
from busmq import Bus, BusSettings, Mode, Queue
from busmq.federation import FederatedQueue, FederationSettings, FederationTarget

SECRET = "bench-secret-0123456789"
TARGET_FLOOD = 25_000.0
TARGET_P99_MS = 3.0


AnyQueue = Queue | FederatedQueue


async def consume(queue: AnyQueue, prefetch: int, on_message: Callable[[bytes], None]) -> None:
    async with queue.consume(Mode.AT_MOST_ONCE, prefetch=prefetch) as consumer:
        async for delivery in consumer:
            on_message(delivery.message.payload)


async def attach_all(make: Callable[[str], AnyQueue], names: list[str]) -> list[AnyQueue]:
    queues = [make(name) for name in names]
    for queue in queues:
        await queue.attach(ttl=60)
    return queues


async def flood(make: Callable[[str], AnyQueue], label: str, args: argparse.Namespace) -> Figures:
    tag = label.split()[0]
    queues = await attach_all(make, [f"{tag}-flood-{i}" for i in range(args.queues)])
    lanes = Lanes(len(queues), args.window)

    outboxed = 0

    async def producer(lane: int) -> None:
        nonlocal outboxed
        while lanes.running:
            await lanes.wait_room(lane, args.batch)
            if not lanes.running:
                return
            lanes.sent[lane] += args.batch
            if await queues[lane].push_batch(payloads(args.batch, args.size)) is None:
                outboxed += 1

    consumers = [
        asyncio.create_task(consume(q, args.prefetch, lambda p, i=i: lanes.take(i, p)))
        for i, q in enumerate(queues)
    ]
    producers = [asyncio.create_task(producer(i)) for i in range(len(queues))]
    figures = await lanes.measure(label, args.warmup, args.seconds)
    figures.outboxed = outboxed
    lanes.stop()
    await cancel(producers)
    await drained(queues)
    await cancel(consumers)
    await close_all(queues)
    return figures


async def fixed_rate(
    make: Callable[[str], AnyQueue], label: str, args: argparse.Namespace, rate: float
) -> Figures:
    tag = label.split()[0]
    queues = await attach_all(make, [f"{tag}-rate-{i}" for i in range(10)])
    lanes = Lanes(len(queues), 10**9)
    consumers = [
        asyncio.create_task(consume(q, args.prefetch, lambda p, i=i: lanes.take(i, p)))
        for i, q in enumerate(queues)
    ]
    await asyncio.sleep(0.5)
    interval = 1.0 / rate
    sent = 0
    inflight: set[asyncio.Task[Any]] = set()
    outboxed = 0

    async def push_one(queue: AnyQueue) -> None:
        nonlocal outboxed
        if await queue.push(payloads(1, args.size)[0]) is None:
            outboxed += 1

    lanes.recording = True
    started = time.perf_counter()
    while (now := time.perf_counter()) - started < args.seconds:
        due = started + sent * interval
        if due > now:
            await asyncio.sleep(due - now)
        task = asyncio.create_task(push_one(queues[sent % len(queues)]))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        sent += 1
    await asyncio.gather(*inflight, return_exceptions=True)
    elapsed = time.perf_counter() - started
    await settle(inflight, lanes, sent)
    figures = Figures(
        label,
        elapsed,
        pushed=sent,
        consumed=sum(lanes.consumed),
        p50_ms=percentile(lanes.latencies, 0.5),
        p99_ms=percentile(lanes.latencies, 0.99),
        p999_ms=percentile(lanes.latencies, 0.999),
        outboxed=outboxed,
    )
    await drained(queues)
    await cancel(consumers)
    await close_all(queues)
    return figures


async def drained(queues: list[AnyQueue], timeout: float = 120.0) -> None:
    """Let what waits in the outbox reach the gateway before the queues are closed."""
    deadline = time.perf_counter() + timeout
    while any(isinstance(q, FederatedQueue) and q.outbox_depth for q in queues):
        if time.perf_counter() > deadline:
            print("warning: the outbox did not drain", file=sys.stderr)
            return
        await asyncio.sleep(0.1)


async def outbox_run(
    bus_b: Bus, gateway_port: int, args: argparse.Namespace
) -> tuple[float, float]:
    """(append msg/s while the link is cut, drain msg/s once it is back)."""
    proxy = Proxy(gateway_port)
    await proxy.start()
    remote = bus_b.federate("outbox-bench", f"http://127.0.0.1:{proxy.port}", secret=SECRET)
    await remote.link.wait_usable(10)
    await remote.attach(ttl=60)
    await proxy.cut()
    total, batch = args.outbox_messages, args.batch
    started = time.perf_counter()
    for _ in range(0, total, batch):
        await remote.push_batch(payloads(batch, args.size))
    append_s = time.perf_counter() - started
    async with remote.link.events.subscribe() as events:
        await proxy.restore()
        started = time.perf_counter()
        async for event in events:  # draining_outbox ... -> ready once the outbox is empty
            if event.kind == "state" and event.details["state"] == "ready":
                break
    drain_s = time.perf_counter() - started
    assert remote.outbox_depth == 0
    await remote.close()
    await proxy.cut()
    return total / append_s, total / drain_s


class Proxy:
    """A minimal cuttable TCP proxy in front of the gateway (see tests/support/tcp_proxy.py)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def restore(self) -> None:
        await self.start()

    async def cut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def close_all(queues: list[AnyQueue]) -> None:
    for queue in queues:
        await queue.close()


async def start_gateway(redis_url: str) -> tuple[asyncio.subprocess.Process, int]:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "busmq_gateway",
        "--listen", f"127.0.0.1:{port}", "--secret", SECRET, "--redis-url", redis_url,
        "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdout is not None
    while b"ready" not in await process.stdout.readline():
        if process.returncode is not None:
            raise RuntimeError("gateway did not start")
    return process, port


def report(rows: list[Figures]) -> None:
    header = f"{'run':<40}{'pushed/s':>12}{'consumed/s':>12}{'p50 ms':>9}{'p99 ms':>9}"
    print(f"\n{header}{'via outbox':>12}")
    for row in rows:
        print(
            f"{row.label:<40}{row.pushed_per_s:>12,.0f}{row.consumed_per_s:>12,.0f}"
            f"{row.p50_ms:>9.2f}{row.p99_ms:>9.2f}{row.outboxed:>12,}"
        )


async def main(args: argparse.Namespace) -> None:
    with local_redis() as redis_a, local_redis() as redis_b, tempfile.TemporaryDirectory() as tmp:
        gateway, port = await start_gateway(redis_a.url)
        bus_a = Bus(BusSettings(redis_urls=(redis_a.url,)))
        bus_b = Bus(BusSettings(redis_urls=(redis_b.url,)))
        try:
            await bus_a.connect()
            await bus_b.connect()
            url = f"http://127.0.0.1:{port}"
            target = FederationTarget(url, secret=SECRET, pool_size=args.pool)
            bus_b.configure_federation(
                FederationSettings(targets=[target], outbox_path=Path(tmp) / "outbox.sqlite3")
            )

            def remote(name: str) -> AnyQueue:
                return bus_b.federate(name, url)

            rows = [
                await flood(remote, "federated flood (at-most-once)", args),
                await flood(bus_a.queue, "direct flood on core (at-most-once)", args),
                await fixed_rate(remote, f"federated {args.rate:,.0f} msg/s", args, args.rate),
                await fixed_rate(
                    bus_a.queue, f"direct {args.rate:,.0f} msg/s on core", args, args.rate
                ),
                await fixed_rate(
                    remote, f"federated {args.low_rate:,.0f} msg/s", args, args.low_rate
                ),
                await fixed_rate(
                    bus_a.queue, f"direct {args.low_rate:,.0f} msg/s on core", args, args.low_rate
                ),
            ]
            append_rate, drain_rate = await outbox_run(bus_b, port, args)
        finally:
            await bus_b.close()
            await bus_a.close()
            gateway.send_signal(signal.SIGTERM)
            await gateway.wait()
    report(rows)
    if args.json:
        write_json(args.json, rows)
    fed, core = rows[0], rows[1]
    ratio = fed.consumed_per_s / core.consumed_per_s if core.consumed_per_s else float("nan")
    print(f"\nfederated / direct core (consumed/s): {ratio:.2f}")
    print(f"outbox: {append_rate:,.0f} msg/s appended while cut, {drain_rate:,.0f} msg/s drained")
    print(f"target: >= {TARGET_FLOOD:,.0f} msg/s per link -> {fed.consumed_per_s:,.0f}")
    print(f"target: p99 <= {TARGET_P99_MS} ms at {args.rate:,.0f} msg/s -> {rows[2].p99_ms:.2f} ms")
    print(f"cpus: {os.cpu_count()}, load average at the end: {os.getloadavg()[0]:.2f}")


def workload_arguments(parser: argparse.ArgumentParser, *, seconds: float) -> None:
    """The options of the flood and fixed-rate runs (shared with clients_bench.py)."""
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--window", type=int, default=2000)
    parser.add_argument("--prefetch", type=int, default=500)
    parser.add_argument("--rate", type=float, default=1000.0)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_arguments(parser, seconds=20.0)
    parser.add_argument("--pool", type=int, default=2)
    parser.add_argument("--low-rate", type=float, default=500.0)
    parser.add_argument("--outbox-messages", type=int, default=20_000)
    parser.add_argument("--json", type=Path, help="also write the figures here (bench/ab.py)")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
