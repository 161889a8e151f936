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

The fixed-rate runs go ``--rounds`` (3) interleaved rounds and print each round's
p50/p99/p99.9 and their medians with the max. ``--impl busmq,node`` also runs the Node.js
busmq's WebSocket federation (``bench/node/federation.js``: npm ``busmq`` 3.1.0) on the same
workload and the same two Redis servers, and prints the ratios.

    .venv/bin/python bench/federation_bench.py                # 10 s per run
    .venv/bin/python bench/federation_bench.py --impl busmq,node --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _flow import (  # bench/ is sys.path[0]
    CpuMeter,
    Figures,
    Lanes,
    forward_output,
    median_row,
    payloads,
    percentile,
    report,
    report_rounds,
    settle,
    write_json,
)
from _gc import GcPauses
from _redis import free_port, local_redis
from busmq import Bus, BusSettings, Mode, Queue
from busmq.federation import FederatedQueue, FederationSettings, FederationTarget

SECRET = "bench-secret-0123456789"
NODE_DIR = Path(__file__).resolve().parent / "node"


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
    make: Callable[[str], AnyQueue],
    label: str,
    args: argparse.Namespace,
    rate: float,
    tag: str,
    server_pid: int | None = None,
) -> Figures:
    queues = await attach_all(make, [f"{tag}-rate-{int(rate)}-{i}" for i in range(10)])
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
    meter = CpuMeter(os.getpid(), server_pid)
    pauses = GcPauses().start()
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
    pauses.stop()
    client_us, server_us = meter.per_message(sent)
    figures = Figures(
        label,
        elapsed,
        pushed=sent,
        consumed=sum(lanes.consumed),
        p50_ms=percentile(lanes.latencies, 0.5),
        p99_ms=percentile(lanes.latencies, 0.99),
        p999_ms=percentile(lanes.latencies, 0.999),
        max_ms=percentile(lanes.latencies, 1.0),
        outboxed=outboxed,
        client_us=client_us,
        server_us=server_us,
        steal_cores=meter.steal.cores(),
        gc_longest_ms=pauses.longest_ms,
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
    forward_output(process)
    return process, port


class NodeFederation:
    """The Node.js busmq's WebSocket federation on the same workload: a server bus on
    Redis A (``bench/node/federation.js --role server``) and, per run, a client bus on
    Redis B that federates its queues (``--role client``)."""

    def __init__(self, redis_a: str, redis_b: str) -> None:
        self.redis_a, self.redis_b = redis_a, redis_b
        self.port = free_port()
        self.server: asyncio.subprocess.Process | None = None
        self.runs = 0

    @staticmethod
    def available() -> bool:
        return (NODE_DIR / "node_modules" / "busmq").is_dir()

    async def start(self) -> None:
        self.server = await asyncio.create_subprocess_exec(
            "node", str(NODE_DIR / "federation.js"), "--role", "server",
            "--redis", self.redis_a, "--port", str(self.port),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.server.stdout is not None
        if b"ready" not in await self.server.stdout.readline():
            raise RuntimeError("the Node.js busmq federation server did not start")

    async def stop(self) -> None:
        if self.server is not None and self.server.returncode is None:
            self.server.send_signal(signal.SIGTERM)
            await self.server.wait()

    async def run(self, label: str, args: argparse.Namespace, rate: float | None) -> Figures:
        self.runs += 1
        scenario = ["--scenario", "flood"] if rate is None else ["--rate", f"{rate:g}"]
        client = await asyncio.create_subprocess_exec(
            "node", str(NODE_DIR / "federation.js"), "--role", "client",
            "--redis", self.redis_b, "--url", f"http://127.0.0.1:{self.port}",
            *scenario, "--tag", f"{os.getpid()}-{self.runs}", "--seconds", f"{args.seconds:g}",
            "--warmup", f"{args.warmup:g}", "--queues", "10" if rate else str(args.queues),
            "--size", str(args.size), "--batch", str(args.batch), "--window", str(args.window),
            "--pool", str(args.pool),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert client.stdout is not None
        meter, got, steal = None, None, float("nan")
        async for line in client.stdout:  # "measuring" opens the window, its figures end it
            if line.startswith(b"measuring"):
                meter = CpuMeter(self.server.pid if self.server else None)
            elif line.startswith(b"{") and meter is not None:
                got = json.loads(line)
                (server_us,) = meter.per_message(got["pushed"])
                steal = meter.steal.cores()
        if await client.wait() != 0 or got is None:
            raise RuntimeError("the Node.js busmq federation client failed")
        return Figures(
            label,
            got["seconds"],
            pushed=got["pushed"],
            consumed=got["consumed"],
            p50_ms=got["p50_ms"],
            p99_ms=got["p99_ms"],
            p999_ms=got["p999_ms"],
            max_ms=got["max_ms"],
            client_us=got["client_cpu"] * 1e6 * got["seconds"] / max(1, got["pushed"]),
            server_us=server_us,
            steal_cores=steal,
        )


def ratio_lines(rows: dict[str, Figures], args: argparse.Namespace) -> list[str]:
    """busmq for Python against the Node.js busmq, each figure as a ratio (same run)."""
    lines = []
    fed, node = rows.get("federated flood (at-most-once)"), rows.get("node busmq federated flood")
    if fed and node and node.consumed_per_s:
        lines.append(f"flood: {fed.consumed_per_s / node.consumed_per_s:.1f}x the Node.js busmq's")
    for rate in (args.rate, args.low_rate):
        fed = rows.get(f"federated {rate:,.0f} msg/s")
        node = rows.get(f"node busmq {rate:,.0f} msg/s")
        if fed and node:
            cells = [
                f"{name} {getattr(fed, attr) / getattr(node, attr):.2f}x"
                for name, attr in (("p50", "p50_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms"))
            ]
            cells += [
                f"{name} CPU/msg {getattr(fed, attr) / getattr(node, attr):.2f}x"
                for name, attr in (("client", "client_us"), ("server", "server_us"))
            ]
            lines.append(f"{rate:,.0f} msg/s, busmq / Node.js busmq: {', '.join(cells)}")
    return lines


async def measure(
    args: argparse.Namespace,
    remote: Callable[[str], AnyQueue],
    direct: Callable[[str], AnyQueue],
    node: NodeFederation | None,
    gateway_pid: int,
) -> tuple[list[Figures], list[list[Figures]]]:
    """The floods, then each fixed rate in interleaved rounds: the rows (medians of the
    rounds) and every round's figures."""
    rows: list[Figures] = []
    runs: list[list[Figures]] = []
    if "busmq" in args.impl:
        rows.append(await flood(remote, "federated flood (at-most-once)", args))
        rows.append(await flood(direct, "direct flood on core (at-most-once)", args))
    if node is not None:
        rows.append(await node.run("node busmq federated flood", args, None))
    for rate in (args.rate, args.low_rate):
        sides = []
        if "busmq" in args.impl:
            sides = [(f"federated {rate:,.0f} msg/s", remote, gateway_pid),
                     (f"direct {rate:,.0f} msg/s on core", direct, None)]  # fmt: skip
        rounds: dict[str, list[Figures]] = {}
        for round_ in range(args.rounds):  # interleaved: this VM's cores are shared
            for label, make, server in sides:
                tag = f"{label.split()[0]}{round_}"
                figures = await fixed_rate(make, label, args, rate, tag, server)
                rounds.setdefault(label, []).append(figures)
            if node is not None:
                label = f"node busmq {rate:,.0f} msg/s"
                rounds.setdefault(label, []).append(await node.run(label, args, rate))
        runs += rounds.values()
        rows += [median_row(r) for r in rounds.values()]
    return rows, runs


async def main(args: argparse.Namespace) -> None:
    with local_redis() as redis_a, local_redis() as redis_b, tempfile.TemporaryDirectory() as tmp:
        gateway, port = await start_gateway(redis_a.url)
        bus_a = Bus(BusSettings(redis_urls=(redis_a.url,)))
        bus_b = Bus(BusSettings(redis_urls=(redis_b.url,)))
        node = NodeFederation(redis_a.url, redis_b.url) if "node" in args.impl else None
        try:
            await bus_a.connect()
            await bus_b.connect()
            if node is not None:
                await node.start()
            url = f"http://127.0.0.1:{port}"
            target = FederationTarget(url, secret=SECRET, pool_size=args.pool)
            bus_b.configure_federation(
                FederationSettings(targets=[target], outbox_path=Path(tmp) / "outbox.sqlite3")
            )

            def remote(name: str) -> AnyQueue:
                return bus_b.federate(name, url)

            rows, runs = await measure(args, remote, bus_a.queue, node, gateway.pid)
            append_rate = drain_rate = None
            if "busmq" in args.impl and args.outbox_messages:
                append_rate, drain_rate = await outbox_run(bus_b, port, args)
        finally:
            await bus_b.close()
            await bus_a.close()
            if node is not None:
                await node.stop()
            gateway.send_signal(signal.SIGTERM)
            await gateway.wait()
    if args.rounds > 1:
        report_rounds(runs)
        print(f"\nfixed rates: medians of {args.rounds} interleaved rounds (each figure alone)")
    report(rows)
    for row in rows:
        if row.outboxed:
            print(f"{row.label}: {row.outboxed:,} pushes went through the outbox")
    if args.json:
        write_json(args.json, rows)
    by_label = {row.label: row for row in rows}
    print()
    for line in ratio_lines(by_label, args):
        print(line)
    fed = by_label.get("federated flood (at-most-once)")
    core = by_label.get("direct flood on core (at-most-once)")
    if fed and core and core.consumed_per_s:
        ratio = fed.consumed_per_s / core.consumed_per_s
        print(f"federated / direct core (consumed/s): {ratio:.2f}")
    if append_rate and drain_rate:
        print(f"outbox: {append_rate:,.0f} msg/s appended while cut,", end=" ")
        print(f"{drain_rate:,.0f} msg/s drained")
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
    workload_arguments(parser, seconds=10.0)
    parser.add_argument("--pool", type=int, default=2)
    parser.add_argument("--low-rate", type=float, default=500.0)
    parser.add_argument("--outbox-messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each fixed-rate run")
    parser.add_argument(
        "--impl",
        default="busmq",
        help="comma list of busmq (this project's federation, and the core direct) and node"
        " (the Node.js busmq's WebSocket federation: cd bench/node && npm ci)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here (bench/ab.py)")
    args = parser.parse_args()
    args.impl = {impl.strip() for impl in args.impl.split(",") if impl.strip()}
    if not args.impl or not args.impl <= {"busmq", "node"}:
        parser.error("--impl: a comma list of busmq, node")
    if "node" in args.impl and not NodeFederation.available():
        parser.error("--impl node: the Node.js busmq is not installed (cd bench/node && npm ci)")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
