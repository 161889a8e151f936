"""The dashboard's data: the metrics snapshot as JSON, with per-queue rates.

Rates come from the queues' pushed and delivered totals (kept in Redis, so they count
every client of the bus) sampled at each read: the rate is the change over the oldest
sample within the last minute. Nothing is sampled while nobody looks.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from busmq.metrics import BusMetrics, Snapshot

WINDOW_SECONDS = 60.0


class Overview:
    def __init__(self, metrics: BusMetrics, window: float = WINDOW_SECONDS) -> None:
        self.metrics = metrics
        self.window = window
        self._samples: deque[tuple[float, dict[str, tuple[int, int]]]] = deque()

    async def read(self) -> dict[str, Any]:
        snapshot = await self.metrics.refresh()
        rates = self._rates(snapshot)
        return {
            "taken_at": snapshot.taken_at,
            "read_seconds": snapshot.read_seconds,
            "error": snapshot.error,
            "queues": [
                {
                    "name": q.name,
                    "shard": q.shard,
                    "depth": q.ready,
                    "messages": q.messages,
                    "pending": q.pending,
                    "oldest_pending_seconds": q.oldest_pending_seconds,
                    "consumers": q.consumers,
                    "delayed": q.delayed,
                    "dead_letters": q.dead_letters,
                    "pushed": q.last_id,
                    "mode": q.mode,
                    "paused": q.paused,
                    "ordering": q.ordering,
                    "ordered_keys_in_flight": q.ordered_keys_in_flight,
                    "ordered_waiting": q.ordered_waiting,
                    "push_rate": rates.get(q.name, (0.0, 0.0))[0],
                    "deliver_rate": rates.get(q.name, (0.0, 0.0))[1],
                }
                for q in snapshot.queues
            ],
            "shards": [
                {"label": s.label, "online": s.online, "ping_ms": _ms(s.ping_seconds)}
                for s in snapshot.shards
            ],
            "federation": [
                {
                    "target": t.url,
                    "current_url": t.current_url,
                    "state": t.state.value,
                    "up": t.state.usable,
                    "outbox": t.outbox_depth,
                    "outbox_age_seconds": t.outbox_age,
                    "lag_messages": t.lag_messages,
                    "lag_seconds": t.lag_seconds,
                    "resumes": t.resumes,
                }
                for t in snapshot.targets
            ],
        }

    def _rates(self, snapshot: Snapshot) -> dict[str, tuple[float, float]]:
        """Messages per second pushed and delivered, per queue, over the window."""
        now = snapshot.taken_at
        totals = {q.name: (q.last_id, q.delivered) for q in snapshot.queues}
        if not self._samples or self._samples[-1][0] != now:
            self._samples.append((now, totals))
        while len(self._samples) > 1 and now - self._samples[0][0] > self.window:
            self._samples.popleft()
        then, before = self._samples[0]
        elapsed = now - then
        if elapsed <= 0:
            return {}
        rates = {}
        for name, (pushed, delivered) in totals.items():
            old_pushed, old_delivered = before.get(name, (0, 0))
            rates[name] = (
                max(pushed - old_pushed, 0) / elapsed,
                max(delivered - old_delivered, 0) / elapsed,
            )
        return rates


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
