"""The dashboard's charts: an hour of each queue's and each federation link's figures,
sampled by the gateway process itself (no extra service, nothing kept in Redis).

A sample is one read of the bus's figures (the same cached read ``/metrics`` makes)
every ``interval`` seconds, from the moment the HTTP listener starts. Each series is a
ring of float32 values, so a queue costs ``5 * 4 * points`` bytes (360 points: 7 KB);
at most ``max_queues`` queues are kept (the first seen, while they exist), so a bus of
a hundred thousand queues does not grow the gateway.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

from busmq.metrics import BusMetrics, Snapshot

log = logging.getLogger(__name__)

WINDOW_SECONDS = 3600.0
QUEUE_SERIES = ("depth", "push_rate", "deliver_rate", "pending", "dead_letters")
LINK_SERIES = ("up", "outbox", "lag_messages", "lag_seconds")


class Series:
    """Named rings of the same length, written together."""

    def __init__(self, names: tuple[str, ...], points: int) -> None:
        self.points = points
        self.times: deque[float] = deque(maxlen=points)
        self._values = {name: array.array("f") for name in names}

    def add(self, taken_at: float, values: dict[str, float]) -> None:
        if len(self.times) == self.points:
            for ring in self._values.values():
                del ring[0]
        self.times.append(taken_at)
        for name, ring in self._values.items():
            ring.append(float(values[name]))

    def as_json(self) -> dict[str, list[float]]:
        rounded = {name: [round(v, 3) for v in ring] for name, ring in self._values.items()}
        return {"t": list(self.times), **rounded}


class History:
    """Samples ``metrics`` every ``interval`` seconds while started."""

    def __init__(
        self,
        metrics: BusMetrics,
        interval: float,
        *,
        window: float = WINDOW_SECONDS,
        max_queues: int = 1000,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.metrics = metrics
        self.interval = interval
        self.points = max(2, int(window / interval))
        self.max_queues = max_queues
        self.queues: dict[str, Series] = {}
        self.links: dict[str, Series] = {}
        self._totals: dict[str, tuple[float, int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._last = 0.0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="busmq-dashboard-history")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                self.add(await self.metrics.refresh())
            except Exception:  # a failed read is a gap in the charts, not a dead sampler
                log.exception("dashboard history: reading the bus's figures failed")
            await asyncio.sleep(self.interval)

    def add(self, snapshot: Snapshot) -> None:
        now = snapshot.taken_at
        if snapshot.error is not None or now == self._last:
            return  # a failed read is a gap; a cached one was sampled already
        self._last = now
        seen = set()
        for q in snapshot.queues:
            seen.add(q.name)
            series = self.queues.get(q.name)
            if series is None:
                if len(self.queues) >= self.max_queues:
                    continue
                series = self.queues[q.name] = Series(QUEUE_SERIES, self.points)
            push_rate, deliver_rate = self._rates(q.name, now, q.last_id, q.delivered)
            series.add(
                now,
                {
                    "depth": q.ready,
                    "push_rate": push_rate,
                    "deliver_rate": deliver_rate,
                    "pending": q.pending,
                    "dead_letters": q.dead_letters,
                },
            )
        for gone in self.queues.keys() - seen:
            del self.queues[gone]
            self._totals.pop(gone, None)
        for t in snapshot.targets:
            link = self.links.setdefault(t.url, Series(LINK_SERIES, self.points))
            link.add(
                now,
                {
                    "up": 1.0 if t.state.usable else 0.0,
                    "outbox": t.outbox_depth,
                    "lag_messages": t.lag_messages,
                    "lag_seconds": t.lag_seconds,
                },
            )

    def _rates(self, name: str, now: float, pushed: int, delivered: int) -> tuple[float, float]:
        """Messages per second pushed and delivered since the previous sample."""
        before = self._totals.get(name)
        self._totals[name] = (now, pushed, delivered)
        if before is None or now <= before[0]:
            return 0.0, 0.0
        elapsed = now - before[0]
        return max(pushed - before[1], 0) / elapsed, max(delivered - before[2], 0) / elapsed

    def queue(self, name: str) -> dict[str, Any] | None:
        series = self.queues.get(name)
        return None if series is None else series.as_json()

    def links_json(self) -> dict[str, dict[str, list[float]]]:
        return {url: series.as_json() for url, series in self.links.items()}
