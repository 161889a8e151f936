"""Flow control and figures shared by the gateway and federation benchmarks."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    outboxed: int = 0  # pushes that went through an outbox (federation)

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
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        return Figures(
            label,
            time.perf_counter() - started,
            pushed=sum(self.sent) - start_sent,
            consumed=sum(self.consumed) - start_consumed,
            p50_ms=percentile(self.latencies, 0.5),
            p99_ms=percentile(self.latencies, 0.99),
            p999_ms=percentile(self.latencies, 0.999),
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
