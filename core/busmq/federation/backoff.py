"""Exponential backoff with jitter, shared by links, streams and the outbox forwarder."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double from ``initial`` up to ``maximum``, each jittered to 50-100 %
    so that many clients cut at once do not come back in lockstep."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self._next = self.initial
