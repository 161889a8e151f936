"""busmq gateway benchmark: the core workload through one gateway process (and through
``--workers`` processes on one port), next to the same workload direct on the core, in
one run.

Workload: ``--queues`` queues (100), ``--size``-byte messages (32); producers push batches
of ``--batch`` and consumers read at-most-once over ``Consume`` streams; each producer
keeps at most ``--window`` messages in flight so consumed == pushed is meaningful. Then a
fixed-rate run (``--rate`` msg/s, single-message pushes) for end-to-end latency. Each
through the gateway twice: with unary ``Push`` calls, and over ``PushStream`` (one stream
per connection). Also the gateway's RSS with ``--idle-streams`` idle streams open.

The script starts its own ``redis-server`` (free loopback port) and its own gateway
process, and stops both at the end.

    .venv/bin/python bench/gateway_bench.py               # 20 s per run
    .venv/bin/python bench/gateway_bench.py --seconds 8 --rounds 3   # medians
    .venv/bin/python bench/gateway_bench.py --pin     # the gateway on a core of its own
    .venv/bin/python bench/gateway_bench.py --gateway-loop uvloop --workers 1
    .venv/bin/python bench/gateway_bench.py --workers 1 --fleet 3   # also nginx over 3 gateways
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psutil

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
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2

ROOT = str(Path(__file__).resolve().parent.parent)
SECRET = "bench-secret-0123456789"
AUTH = (("authorization", f"Bearer {SECRET}"),)
UVLOOP_GATEWAY = (
    "import asyncio, sys, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy());"
    " from busmq_gateway.__main__ import main; main(sys.argv[1:])"
)


# -- the two transports ---------------------------------------------------------------


class PushStream:
    """One ``PushStream`` call: pushes written by one writer task, outcomes matched to
    their pushes by sequence."""

    def __init__(self, stub: Any) -> None:
        self.call = stub.PushStream(metadata=AUTH)
        self.sequence = 0
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.outgoing: asyncio.Queue[pb.PushStreamRequest] = asyncio.Queue()
        self.tasks = [asyncio.create_task(self._write()), asyncio.create_task(self._read())]

    async def push(self, request: pb.PushRequest) -> None:
        self.sequence += 1
        future = self.waiting[self.sequence] = asyncio.get_running_loop().create_future()
        self.outgoing.put_nowait(pb.PushStreamRequest(sequence=self.sequence, push=request))
        outcome = await future
        if outcome.HasField("error"):
            raise RuntimeError(f"push failed: {outcome.error}")

    async def _write(self) -> None:
        while True:
            await self.call.write(await self.outgoing.get())

    async def _read(self) -> None:
        async for response in self.call:
            for outcome in response.outcomes:
                future = self.waiting.pop(outcome.sequence)
                if not future.done():  # its pusher may have been cancelled
                    future.set_result(outcome)

    async def close(self) -> None:
        await _cancel(self.tasks)
        self.call.cancel()


class GatewayTransport:
    """Calls through ``channels`` connections (each its own: with several gateway
    workers, the kernel spreads connections, not calls), a queue's calls on one.
    Pushes are unary ``Push`` calls, or with ``streamed`` go over one ``PushStream``
    per connection."""

    def __init__(self, target: str, channels: int = 1, streamed: bool = False) -> None:
        options = [("grpc.use_local_subchannel_pool", 1)]
        self.channels = [
            grpc.aio.insecure_channel(target, options=options) for _ in range(channels)
        ]
        self.stubs = [queue_service_pb2_grpc.QueueServiceStub(c) for c in self.channels]
        self.channel = self.channels[0]
        self.stub = self.stubs[0]
        self.streamed = streamed
        self.streams: list[PushStream] = []

    def _lane(self, name: str) -> int:
        return hash(name) % len(self.stubs)

    async def prepare(self, names: list[str]) -> None:
        for name in names:
            stub = self.stubs[self._lane(name)]
            await stub.AttachQueue(pb.AttachQueueRequest(queue=name), metadata=AUTH)
        if self.streamed and not self.streams:
            self.streams = [PushStream(stub) for stub in self.stubs]

    async def push(self, name: str, batch: list[bytes]) -> None:
        messages = [types_pb2.OutgoingMessage(payload=p) for p in batch]
        request = pb.PushRequest(queue=name, messages=messages)
        if self.streams:
            await self.streams[self._lane(name)].push(request)
        else:
            await self.stubs[self._lane(name)].Push(request, metadata=AUTH)

    async def consume(self, name: str, on_message: Callable[[bytes], None]) -> None:
        request = pb.ConsumeRequest(queue=name, prefetch=200, batch=True)
        call = self.stubs[self._lane(name)].Consume(request, metadata=AUTH)
        try:
            async for response in call:
                if response.HasField("batch"):
                    for delivery in response.batch.deliveries:
                        on_message(delivery.message.payload)
        except asyncio.CancelledError:
            call.cancel()
            raise

    async def close(self) -> None:
        for stream in self.streams:
            await stream.close()
        for channel in self.channels:
            await channel.close()


class CoreTransport:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.queues: dict[str, Queue] = {}

    async def prepare(self, names: list[str]) -> None:
        for name in names:
            queue = self.bus.queue(name)
            await queue.attach()
            self.queues[name] = queue

    async def push(self, name: str, batch: list[bytes]) -> None:
        await self.queues[name].push_batch(batch)

    async def consume(self, name: str, on_message: Callable[[bytes], None]) -> None:
        async with self.queues[name].consume(Mode.AT_MOST_ONCE, prefetch=200) as consumer:
            async for delivery in consumer:
                on_message(delivery.message.payload)

    async def close(self) -> None:
        for queue in self.queues.values():
            await queue.close()


Transport = GatewayTransport | CoreTransport


# -- runs ----------------------------------------------------------------------------


async def flood(transport: Transport, label: str, args: argparse.Namespace, tag: str) -> Figures:
    names = [f"{tag}-{i}" for i in range(args.queues)]
    await transport.prepare(names)
    lanes = Lanes(args.queues, args.window)

    async def producer(lane: int) -> None:
        while lanes.running:
            await lanes.wait_room(lane, args.batch)
            if not lanes.running:
                return
            lanes.sent[lane] += args.batch
            await transport.push(names[lane], payloads(args.batch, args.size))

    consumers = [
        asyncio.create_task(transport.consume(n, lambda p, i=i: lanes.take(i, p)))
        for i, n in enumerate(names)
    ]
    producers = [asyncio.create_task(producer(i)) for i in range(args.queues)]
    figures = await lanes.measure(label, args.warmup, args.seconds)
    lanes.stop()
    await _cancel(producers + consumers)
    return figures


async def fixed_rate(
    transport: Transport, label: str, args: argparse.Namespace, tag: str
) -> Figures:
    """``--rate-rounds`` rounds of ``--seconds`` at ``--rate`` msg/s over the same streams;
    each round is kept in ``args.rate_runs`` (printed), the medians returned."""
    names = [f"{tag}-{i}" for i in range(min(args.queues, 10))]
    await transport.prepare(names)
    lanes = Lanes(len(names), 10**9)
    consumers = [
        asyncio.create_task(transport.consume(n, lambda p, i=i: lanes.take(i, p)))
        for i, n in enumerate(names)
    ]
    await asyncio.sleep(0.5)
    rounds = []
    for _ in range(args.rate_rounds):
        lanes.latencies = array("q")
        rounds.append(await one_rate_round(transport, names, lanes, label, args))
    await _cancel(consumers)
    args.rate_runs.append(rounds)
    return median_row(rounds)


async def one_rate_round(
    transport: Transport, names: list[str], lanes: Lanes, label: str, args: argparse.Namespace
) -> Figures:
    interval = 1.0 / args.rate
    sent = 0
    before = sum(lanes.consumed)
    meter = CpuMeter(os.getpid(), args.server_pid)
    pauses = GcPauses().start()
    lanes.recording = True
    started = time.perf_counter()
    inflight: set[asyncio.Task[None]] = set()
    while (now := time.perf_counter()) - started < args.seconds:
        due = started + sent * interval
        if due > now:
            await asyncio.sleep(due - now)
        task = asyncio.create_task(transport.push(names[sent % len(names)], payloads(1, args.size)))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        sent += 1
    elapsed = time.perf_counter() - started
    await settle(inflight, lanes, before + sent)
    pauses.stop()
    client_us, server_us = meter.per_message(sent)
    lanes.recording = False
    return Figures(
        label,
        elapsed,
        pushed=sent,
        consumed=sum(lanes.consumed) - before,
        client_us=client_us,
        server_us=server_us,
        steal_cores=meter.steal.cores(),
        gc_longest_ms=pauses.longest_ms,
        p50_ms=percentile(lanes.latencies, 0.5),
        p99_ms=percentile(lanes.latencies, 0.99),
        p999_ms=percentile(lanes.latencies, 0.999),
        max_ms=percentile(lanes.latencies, 1.0),
    )


async def idle_streams_rss(target: str, pid: int, count: int) -> tuple[float, float]:
    transport = GatewayTransport(target)
    await transport.prepare(["idle"])
    process = psutil.Process(pid)
    before = process.memory_info().rss / 2**20
    calls = [
        transport.stub.Consume(pb.ConsumeRequest(queue="idle"), metadata=AUTH) for _ in range(count)
    ]
    iterators = [call.__aiter__() for call in calls]
    await asyncio.gather(*(it.__anext__() for it in iterators))  # every stream "started"
    await asyncio.sleep(1)
    after = process.memory_info().rss / 2**20
    for call in calls:
        call.cancel()
    await transport.close()
    return before, after


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def push_ways() -> tuple[bool, ...]:
    """Unary ``Push``, and ``PushStream`` where the tree under test has it (bench/ab.py
    runs older trees: a run their gateway cannot serve is left out)."""
    methods = pb.DESCRIPTOR.services_by_name["QueueService"].methods_by_name
    return (False, True) if "PushStream" in methods else (False,)


@functools.cache
def gateway_options() -> str:
    """The gateway's ``--help`` text: which options the gateway under test has."""
    done = subprocess.run(
        [sys.executable, "-m", "busmq_gateway", "--help"], capture_output=True, text=True
    )
    return done.stdout


async def start_gateway(
    redis_url: str,
    workers: int = 1,
    cpus: set[int] | None = None,
    loop: str = "asyncio",
    port: int | None = None,
) -> tuple[asyncio.subprocess.Process, str]:
    port = port or free_port()
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    # uvloop for the gateway (one worker): its policy set before the gateway's main.
    start = ["-m", "busmq_gateway"] if loop == "asyncio" else ["-c", UVLOOP_GATEWAY]
    # Options an older gateway lacks (bench/ab.py runs older trees) are left out.
    optional = [("--workers", str(workers)), ("--http-listen", "off")]
    extra = [part for option in optional if option[0] in gateway_options() for part in option]
    if workers > 1 and "--workers" not in gateway_options():
        raise RuntimeError("this gateway has no --workers")
    process = await asyncio.create_subprocess_exec(
        sys.executable, *start,
        "--listen", f"127.0.0.1:{port}", "--secret", SECRET, "--redis-url", redis_url,
        "--log-level", "warning", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, preexec_fn=pin,
    )  # fmt: skip
    assert process.stdout is not None
    while b"ready" not in await process.stdout.readline():
        if process.returncode is not None:
            raise RuntimeError("gateway did not start")
    forward_output(process)
    return process, f"127.0.0.1:{port}"


async def with_workers(args: argparse.Namespace, redis_url: str, workers: int) -> list[Figures]:
    """The flood and the fixed-rate run through a gateway of ``workers`` processes, with
    unary pushes and over push streams."""
    gateway, target = await start_gateway(
        redis_url, workers, args.gateway_cpus, args.gateway_loop or args.loop
    )
    # The gateway's own CPU per message (with --workers N its workers are children: not
    # counted, so only for one).
    args.server_pid = gateway.pid if workers == 1 else None
    rows: list[Figures] = []
    try:
        for streamed in push_ways():
            remote = GatewayTransport(target, channels=8 if workers > 1 else 1, streamed=streamed)
            how = "PushStream" if streamed else "unary Push"
            label = f"gateway x{workers}, {how}"
            tag = f"w{workers}{'s' if streamed else 'u'}"
            rows.append(await flood(remote, f"flood {label}", args, tag))
            rows.append(
                await fixed_rate(remote, f"{args.rate:,.0f} msg/s {label}", args, tag + "r")
            )
            await remote.close()
        if workers == 1 and args.idle_streams:
            before, after = await idle_streams_rss(target, gateway.pid, args.idle_streams)
            print(
                f"gateway RSS: {before:.0f} MiB -> {after:.0f} MiB with {args.idle_streams} idle"
                f" streams ({(after - before) * 1024 / args.idle_streams:.1f} KiB per stream)"
            )
        return rows
    finally:
        gateway.send_signal(signal.SIGTERM)
        await gateway.wait()


async def with_fleet(args: argparse.Namespace, redis_url: str, size: int) -> list[Figures]:
    """The flood and the fixed-rate run through nginx over ``size`` gateways (one
    process each), as ``tests/fleet`` and the README run them: every call to the next."""
    sys.path.insert(0, ROOT)  # the fleet tests' nginx runner
    from tests.support.nginx import Nginx

    gateways = [await start_gateway(redis_url, 1, loop=args.gateway_loop or args.loop)
                for _ in range(size)]  # fmt: skip
    args.server_pid = None  # spread over several processes
    rows: list[Figures] = []
    try:
        with tempfile.TemporaryDirectory() as directory:
            async with Nginx(Path(directory), [target for _, target in gateways]) as nginx:
                for streamed in push_ways():
                    remote = GatewayTransport(nginx.target, streamed=streamed)
                    how = "PushStream" if streamed else "unary Push"
                    label = f"nginx over {size} gateways, {how}"
                    tag = f"f{size}{'s' if streamed else 'u'}"
                    rows.append(await flood(remote, f"flood {label}", args, tag))
                    rate = f"{args.rate:,.0f} msg/s {label}"
                    rows.append(await fixed_rate(remote, rate, args, tag + "r"))
                    await remote.close()
        return rows
    finally:
        for process, _ in gateways:
            process.send_signal(signal.SIGTERM)
            await process.wait()


async def direct(args: argparse.Namespace, redis_url: str) -> list[Figures]:
    args.server_pid = None
    bus = Bus(BusSettings(redis_urls=(redis_url,)))
    await bus.connect()
    try:
        core = CoreTransport(bus)
        rows = [
            await flood(core, "flood direct on core", args, "core"),
            await fixed_rate(core, f"{args.rate:,.0f} msg/s direct on core", args, "cr"),
        ]
        await core.close()
        return rows
    finally:
        await bus.close()


async def main(args: argparse.Namespace) -> None:
    args.gateway_cpus = None
    if args.pin:
        # The gateway on the last core, this process and its Redis (started after
        # this, so inheriting it) on the others: each side's latency without the
        # other's scheduling. Floods are then not comparable to direct, which has one
        # core less.
        cpus = sorted(os.sched_getaffinity(0))
        args.gateway_cpus = {cpus[-1]}
        os.sched_setaffinity(0, set(cpus[:-1]))
        print(f"pinned: gateway on cpu {cpus[-1]}, client and Redis on {cpus[:-1]}")
    rounds: list[list[Figures]] = []
    args.rate_runs = []
    with local_redis() as redis:
        for _ in range(args.rounds):  # interleaved: this VM's cores are shared
            rows = await direct(args, redis.url)
            for workers in args.workers:
                rows += await with_workers(args, redis.url, workers)
            if args.fleet:
                rows += await with_fleet(args, redis.url, args.fleet)
            rounds.append(rows)
    rows = [median_row([r[i] for r in rounds]) for i in range(len(rounds[0]))]
    if args.rate_rounds > 1:
        report_rounds(args.rate_runs)
    if args.rounds > 1 or args.rate_rounds > 1:
        print(f"\nmedians of {args.rounds} interleaved rounds, {args.rate_rounds} per fixed rate")
    report(rows)
    if args.json:
        write_json(args.json, rows)
    core_flood, core_rate = rows[0], rows[1]
    print(f"\ntargets: flood >= 0.6x direct; p99 <= 1 ms at {args.rate:,.0f} msg/s")
    print(f"direct: flood {core_flood.consumed_per_s:,.0f} msg/s, p99 {core_rate.p99_ms:.2f} ms")
    for row in rows[2:]:
        if row.label.startswith("flood"):
            ratio = row.consumed_per_s / core_flood.consumed_per_s if core_flood.consumed else 0
            print(f"{row.label}: {ratio:.2f}x direct")
        else:
            ratio = row.p99_ms / core_rate.p99_ms if core_rate.p99_ms else float("nan")
            print(f"{row.label}: p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms"
                  f" ({ratio:.1f}x direct), p99.9 {row.p999_ms:.2f} ms")  # fmt: skip
    gateway_loop = args.gateway_loop or args.loop
    print(f"event loops: this process {args.loop}, gateway {gateway_loop}")
    print(f"cpus: {os.cpu_count()}, load average at the end: {os.getloadavg()[0]:.2f}")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--idle-streams", type=int, default=1000)
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2],
        help="gateway process counts to measure, e.g. 1,2",
    )
    parser.add_argument(
        "--fleet",
        type=int,
        default=0,
        help="also through Debian's nginx over this many gateways (0: not)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (medians)")
    parser.add_argument("--rate-rounds", type=int, default=3, help="rounds of each fixed rate")
    parser.add_argument("--json", type=Path, help="also write the figures here (bench/ab.py)")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop of this process (direct core and clients) and of the gateway",
    )
    parser.add_argument(
        "--gateway-loop", choices=("asyncio", "uvloop"), help="the gateway's, if not --loop"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="run the gateway on a core of its own (latency; floods not comparable)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    if arguments.loop == "uvloop":
        import uvloop

        uvloop.run(main(arguments))
    else:
        asyncio.run(main(arguments))
