"""The lease renewals of a bus's attached queues, spread over the renewal interval.

Every attached queue (``auto_renew``) is renewed once every ``lease_seconds / 3``, so that
its lease outlives two failed renewals. The renewals leave in slices, one slice per tick
of ``interval / slices``, instead of all at once: a burst of one attach script per queue
kept Redis and the client busy for milliseconds, and the deliveries in flight waited
behind it (``bench/core_bench.py`` at 5,000 msg/s over 100 queues: p99.9 4.3-4.6 ms with
the burst every 5 s, 1.8-3.2 ms with no renewal in the window).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any

from .context import Lease

TICK_SECONDS = 0.1  # the shortest pause between two slices
MAX_SLICES = 50


def slice_count(interval: float) -> int:
    """How many slices a renewal interval of ``interval`` seconds is cut into."""
    return max(1, min(MAX_SLICES, int(interval / TICK_SECONDS)))


class RenewalSlices:
    """The attached queues in ``slices`` groups, renewed one group a tick: each queue once
    a round. A newcomer joins the smallest group (so that queues attached together are
    spread too); its first renewal comes within a round (about one round after it was
    attached, as a lease taken then needs), and a queue gone is dropped."""

    def __init__(self, slices: int) -> None:
        self.slices = slices
        self._groups: list[set[Lease]] = [set() for _ in range(slices)]
        self._group_of: dict[Lease, int] = {}
        self._tick = 0

    def due(self, attached: Collection[Lease]) -> list[Lease]:
        """The queues to renew at this tick, of those ``attached``; advances the tick."""
        current = {queue for queue in attached if queue.auto_renew}
        for gone in self._group_of.keys() - current:
            self._groups[self._group_of.pop(gone)].discard(gone)
        # Of the smallest groups, the one whose turn is furthest: not this tick's, which
        # would renew a queue just attached.
        order = [(self._tick - k) % self.slices for k in range(1, self.slices + 1)]
        for new in current - self._group_of.keys():
            group = min(order, key=lambda g: len(self._groups[g]))
            self._groups[group].add(new)
            self._group_of[new] = group
        due = list(self._groups[self._tick])
        self._tick = (self._tick + 1) % self.slices
        return due


async def renew_in_slices(
    attached: Collection[Lease],
    interval: float,
    renew: Callable[[Sequence[Lease]], Coroutine[Any, Any, None]],
) -> None:
    """Run until cancelled: ``renew`` the queues of one slice of ``attached`` (a live
    collection) each tick. A slice's renewals run beside the ticks, so that an outage
    that holds them up does not hold up the slices after it; a queue whose renewal still
    waits is not sent another (an outage holds up one renewal per queue). The ticks go
    on with nothing attached (a wake every ``TICK_SECONDS`` at most), so that a queue
    attached then is renewed within a round like any other."""
    slices = RenewalSlices(slice_count(interval))
    running: set[asyncio.Task[None]] = set()
    renewing: set[Lease] = set()

    async def renew_slice(queues: list[Lease]) -> None:
        renewing.update(queues)
        try:
            await renew(queues)
        finally:
            renewing.difference_update(queues)

    try:
        while True:
            await asyncio.sleep(interval / slices.slices)
            due = [queue for queue in slices.due(attached) if queue not in renewing]
            if due:
                task = asyncio.create_task(renew_slice(due), name="busmq-lease-renewal-slice")
                running.add(task)
                task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
