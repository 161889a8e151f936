"""Flow control and figures shared by the gateway and federation benchmarks."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import sys
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from _gc import GcPauses  # bench/ is sys.path[0]
from _redis import machine_steal_seconds

STAMP = struct.Struct("<q")  # send time (perf_counter_ns) at the head of each payload


@dataclass
class Figures:
    label: str
    seconds: float = 0.0
    pushed: int = 0
    consumed: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    p999_ms: float = float("nan")
    max_ms: float = float("nan")
    outboxed: int = 0  # pushes that went through an outbox (federation)
    # CPU per message (µs) of the client process (producer and consumer) and of the
    # server process (gateway, or the Node.js busmq's federation server), when measured.
    client_us: float = float("nan")
    server_us: float = float("nan")
    # Cores the hypervisor gave to other guests during the window (see
    # machine_steal_seconds): a round whose tail is long for that reason says so here.
    steal_cores: float = float("nan")
    # The longest garbage-collection pause of this (the client) process in the window
    # (bench/_gc.py).
    gc_longest_ms: float = float("nan")

    @property
    def pushed_per_s(self) -> float:
        return self.pushed / self.seconds if self.seconds else 0.0

    @property
    def consumed_per_s(self) -> float:
        return self.consumed / self.seconds if self.seconds else 0.0


class Lanes:
    """Per-queue flow window: a producer waits while its queue has too much in flight."""

    def __init__(self, queues: int, window: int) -> None:
        self.sent = [0] * queues
        self.consumed = [0] * queues
        self.window = window
        self.rooms = [asyncio.Event() for _ in range(queues)]
        self.latencies = array("q")
        self.recording = False
        self.running = True

    async def wait_room(self, lane: int, count: int) -> None:
        while self.running and self.sent[lane] - self.consumed[lane] + count > self.window:
            self.rooms[lane].clear()
            await self.rooms[lane].wait()

    def take(self, lane: int, payload: bytes) -> None:
        if self.recording:
            self.latencies.append(time.perf_counter_ns() - STAMP.unpack_from(payload)[0])
        self.consumed[lane] += 1
        if self.sent[lane] - self.consumed[lane] <= self.window // 2:
            self.rooms[lane].set()

    async def measure(self, label: str, warmup: float, seconds: float) -> Figures:
        """Let the flow settle for ``warmup`` seconds, then record for ``seconds``: the
        figures of that window (latencies only of messages taken while recording)."""
        await asyncio.sleep(warmup)
        start_consumed, start_sent = sum(self.consumed), sum(self.sent)
        self.recording = True
        steal, pauses = StealMeter(), GcPauses().start()
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        pauses.stop()
        return Figures(
            label,
            time.perf_counter() - started,
            steal_cores=steal.cores(),
            gc_longest_ms=pauses.longest_ms,
            pushed=sum(self.sent) - start_sent,
            consumed=sum(self.consumed) - start_consumed,
            p50_ms=percentile(self.latencies, 0.5),
            p99_ms=percentile(self.latencies, 0.99),
            p999_ms=percentile(self.latencies, 0.999),
            max_ms=percentile(self.latencies, 1.0),
        )

    def stop(self) -> None:
        self.running = False
        for room in self.rooms:
            room.set()


async def settle(inflight: set[asyncio.Task[Any]], lanes: Lanes, sent: int) -> None:
    """After a fixed-rate run: wait for the pushes under way (5 s at most), then for
    their messages to be consumed (2 s at most)."""
    if inflight:
        await asyncio.wait(inflight, timeout=5)
    deadline = time.perf_counter() + 2
    while sum(lanes.consumed) < sent and time.perf_counter() < deadline:  # noqa: ASYNC110 - a deadline, not an event
        await asyncio.sleep(0.01)


def write_json(path: Path, rows: list[Figures]) -> None:
    """The rows as ``bench/ab.py`` reads them: a label and named figures each."""
    payload = [
        {
            "label": row.label,
            "consumed/s": row.consumed_per_s,
            "p50 ms": row.p50_ms,
            "p99 ms": row.p99_ms,
            "p99.9 ms": row.p999_ms,
            "max ms": row.max_ms,
            "client us/msg": row.client_us,
            "server us/msg": row.server_us,
            "steal cores": row.steal_cores,
            "client gc ms": row.gc_longest_ms,
        }
        for row in rows
    ]
    path.write_text(json.dumps({"rows": payload}, indent=2))


def payloads(count: int, size: int) -> list[bytes]:
    pad = bytes(max(0, size - STAMP.size))
    now = time.perf_counter_ns()
    return [STAMP.pack(now) + pad for _ in range(count)]


def percentile(values: array[int], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


def median_row(rows: list[Figures]) -> Figures:
    """Each figure's median over rounds of one run (each column on its own)."""

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    seconds = median([r.seconds for r in rows])
    return Figures(
        rows[0].label,
        seconds,
        pushed=int(median([r.pushed_per_s for r in rows]) * seconds),
        consumed=int(median([r.consumed_per_s for r in rows]) * seconds),
        p50_ms=median([r.p50_ms for r in rows]),
        p99_ms=median([r.p99_ms for r in rows]),
        p999_ms=median([r.p999_ms for r in rows]),
        max_ms=median([r.max_ms for r in rows]),
        outboxed=int(median([float(r.outboxed) for r in rows])),
        client_us=median([r.client_us for r in rows]),
        server_us=median([r.server_us for r in rows]),
        steal_cores=median([r.steal_cores for r in rows]),
        gc_longest_ms=median([r.gc_longest_ms for r in rows]),
    )


def report(rows: list[Figures], width: int = 40) -> None:
    """One line per run: throughput, and latency with its tail (p99.9 and the max)."""
    latency = f"{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'max ms':>9}"
    cpu = any(not math.isnan(r.client_us) for r in rows)
    cpu_header = f"{'client us':>11}{'server us':>11}" if cpu else ""
    print(f"\n{'run':<{width}}{'pushed/s':>12}{'consumed/s':>12}{latency}{cpu_header}{'steal':>7}")
    for row in rows:
        cells = f"{row.client_us:>11.0f}{row.server_us:>11.0f}" if cpu else ""
        cells += f"{row.steal_cores:>7.2f}"
        print(
            f"{row.label:<{width}}{row.pushed_per_s:>12,.0f}{row.consumed_per_s:>12,.0f}"
            f"{row.p50_ms:>9.2f}{row.p99_ms:>9.2f}{row.p999_ms:>10.2f}{row.max_ms:>9.2f}{cells}"
        )
    if cpu:
        print("(client/server us: CPU per message of the client and the server process)")
    print("(steal: cores the hypervisor gave to other guests meanwhile, of this VM's cores)")


def report_rounds(runs: list[list[Figures]], width: int = 40) -> None:
    """Each round's latency figures, so that a single unstable number shows as one, and
    what may explain one: the cores the hypervisor took meanwhile (steal), and this
    client process's longest garbage-collection pause."""
    columns = {
        "p50 ms": "p50_ms",
        "p99 ms": "p99_ms",
        "p99.9 ms": "p999_ms",
        "steal cores": "steal_cores",
        "client gc ms": "gc_longest_ms",
    }
    print(f"\n{'run, each round':<{width}}" + "".join(f"{h:>20}" for h in columns))
    for rounds in runs:
        cells = [" ".join(f"{getattr(r, name):.2f}" for r in rounds) for name in columns.values()]
        print(f"{rounds[0].label:<{width}}" + "".join(f"{c:>20}" for c in cells))
    print("(client gc ms: the longest pause of this process's garbage collector in the round)")


class StealMeter:
    """Cores the hypervisor gave to other guests since this meter was made."""

    def __init__(self) -> None:
        self.start = machine_steal_seconds()
        self.started = time.perf_counter()

    def cores(self) -> float:
        elapsed = time.perf_counter() - self.started
        return (machine_steal_seconds() - self.start) / elapsed if elapsed > 0 else math.nan


class CpuMeter:
    """CPU seconds of processes over a window, per message; and the machine's steal."""

    def __init__(self, *pids: int | None) -> None:
        self.processes = [psutil.Process(pid) if pid else None for pid in pids]
        self.start = [self._cpu(p) for p in self.processes]
        self.steal = StealMeter()

    @staticmethod
    def _cpu(process: psutil.Process | None) -> float:
        if process is None:
            return math.nan
        times = process.cpu_times()
        return float(times.user + times.system)

    def per_message(self, messages: int) -> list[float]:
        """µs of CPU per message of each process since this meter was made."""
        return [
            (self._cpu(p) - start) * 1e6 / messages if messages else math.nan
            for p, start in zip(self.processes, self.start, strict=True)
        ]


_FORWARDERS: set[asyncio.Task[None]] = set()


def forward_output(process: asyncio.subprocess.Process) -> None:
    """Copy what a started server (a gateway) prints from now on to this process's
    stderr. Its stdout is a pipe: unread, it fills up after 64 KiB of log and the
    server blocks in its next log call."""
    stream = process.stdout
    if stream is None:
        return

    async def copy() -> None:
        while line := await stream.readline():
            sys.stderr.write(line.decode(errors="replace"))

    task = asyncio.create_task(copy())
    _FORWARDERS.add(task)
    task.add_done_callback(_FORWARDERS.discard)
