"""The garbage collector's pauses in a bench's own process, over a measured window.

CPython's collector stops the process while it runs; a full collection walks every
container object (grpc, protobuf and every imported module among them), and each
message waiting meanwhile carries the pause into the latency tail. Counted beside the
figures, such a pause tells a stall of the bench's own process from one of the path
it measures.
"""

from __future__ import annotations

import gc
import time
from typing import Any


class GcPauses:
    """Between ``start()`` and ``stop()``: how many full collections ran, and the longest
    pause of any collection (seconds)."""

    def __init__(self) -> None:
        self.full = 0
        self.longest = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.longest = max(self.longest, time.perf_counter() - self._started)
        if info["generation"] == 2:
            self.full += 1

    def start(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    @property
    def longest_ms(self) -> float:
        return self.longest * 1e3
