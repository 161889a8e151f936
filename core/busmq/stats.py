"""What this process did to each queue, counted as it happens: the process-side half of
the metrics (:mod:`busmq.metrics` reads the Redis-side half at scrape time).

Plain integers in a dict per kind, incremented once per batch on the hot paths: no lock
(one event loop), no metrics library below the bus.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Protocol


class _Counted(Protocol):
    @property
    def delivery_count(self) -> int: ...


KINDS = ("pushed", "delivered", "redelivered", "acked", "retried", "rejected")
"""What is counted: messages pushed, delivered (every hand-out, first or not),
redelivered (hand-outs after the first), acked, nacked for a retry, and rejected to the
dead letters. Dead letters made by the read scripts (past ``max_deliveries``, expired)
are counted in Redis: see the dead-letter queue's ``last_id``."""


class ProcessCounters:
    """Totals per kind and queue since the process started."""

    def __init__(self) -> None:
        self._counts: dict[str, defaultdict[str, int]] = {k: defaultdict(int) for k in KINDS}

    def add(self, kind: str, queue: str, count: int = 1) -> None:
        if count:
            self._counts[kind][queue] += count

    def delivered(self, queue: str, deliveries: Iterable[_Counted]) -> None:
        total = again = 0
        for delivery in deliveries:
            total += 1
            if delivery.delivery_count > 1:
                again += 1
        self.add("delivered", queue, total)
        self.add("redelivered", queue, again)

    def of(self, kind: str) -> Mapping[str, int]:
        """Totals of one kind, by queue."""
        return self._counts[kind]

    def total(self, kind: str, queue: str) -> int:
        return self._counts[kind].get(queue, 0)
