"""The bus's lease renewals, spread over their interval (``busmq.renewal``): pure logic;
renewal against Redis is in ``test_faults.py`` (a queue outlives its ttl)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from busmq.context import Lease
from busmq.events import Event, EventHub
from busmq.renewal import RenewalSlices, renew_in_slices, slice_count


@dataclass(eq=False)
class FakeLease:
    name: str
    auto_renew: bool = True
    events: EventHub[Event] = field(default_factory=EventHub)

    async def renew(self) -> bool:
        return True

    async def detach(self) -> None:
        return None


def leases(n: int, prefix: str = "q") -> list[Lease]:
    return [FakeLease(f"{prefix}{i}") for i in range(n)]


def test_the_interval_is_cut_into_slices_of_a_tenth_of_a_second_at_most_fifty() -> None:
    assert slice_count(5.0) == 50  # the default lease of 15 s
    assert slice_count(1.0) == 10
    assert slice_count(0.15) == 1
    assert slice_count(600.0) == 50


def test_queues_attached_together_are_renewed_once_a_round_in_even_slices() -> None:
    plan = RenewalSlices(10)
    attached: set[Lease] = set(leases(95))
    for _ in range(3):
        rounds = [plan.due(attached) for _ in range(10)]
        assert max(len(r) for r in rounds) == 10  # ceil(95 / 10), not 95 at once
        assert Counter(q for r in rounds for q in r) == Counter(attached)  # each once


def test_a_newcomer_is_renewed_within_a_round_and_a_queue_gone_no_more() -> None:
    plan = RenewalSlices(5)
    first = leases(10)
    attached: set[Lease] = set(first)
    plan.due(attached)
    plan.due(attached)
    newcomer: Lease = FakeLease("new")
    attached.add(newcomer)
    renewed = [plan.due(attached) for _ in range(5)]
    assert [newcomer in r for r in renewed] == [False] * 4 + [True]  # a round after joining
    gone = first[0]
    attached.discard(gone)
    assert gone not in [q for _ in range(5) for q in plan.due(attached)]
    manual: Lease = FakeLease("manual", auto_renew=False)
    attached.add(manual)
    assert manual not in [q for _ in range(5) for q in plan.due(attached)]


async def test_the_loop_renews_every_queue_once_a_round_slice_by_slice() -> None:
    attached: set[Lease] = set(leases(20))
    calls: list[Sequence[Lease]] = []
    every_queue_twice = asyncio.Event()

    async def renew(queues: Sequence[Lease]) -> None:
        calls.append(queues)
        counts = Counter(q for call in calls for q in call)
        if len(counts) == 20 and min(counts.values()) >= 2:
            every_queue_twice.set()

    task = asyncio.create_task(renew_in_slices(attached, 0.5, renew))  # 5 slices
    try:
        await asyncio.wait_for(every_queue_twice.wait(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert max(len(c) for c in calls) == 4  # 20 queues over 5 slices


class CountedSet(set[Lease]):
    """The attached queues; counts the loop's ticks (each reads them once)."""

    def __init__(self, queues: list[Lease]) -> None:
        super().__init__(queues)
        self.ticks = 0
        self.ticked = asyncio.Event()

    def __iter__(self) -> Iterator[Lease]:
        self.ticks += 1
        self.ticked.set()
        return super().__iter__()


async def test_a_renewal_held_up_by_an_outage_is_not_sent_again_meanwhile() -> None:
    attached = CountedSet(leases(4))
    calls: list[Sequence[Lease]] = []
    outage_over = asyncio.Event()

    async def renew(queues: Sequence[Lease]) -> None:
        calls.append(queues)
        await outage_over.wait()

    task = asyncio.create_task(renew_in_slices(attached, 0.2, renew))  # 2 slices
    try:
        while attached.ticks < 7:  # three rounds and more
            attached.ticked.clear()
            await attached.ticked.wait()
        assert Counter(q for call in calls for q in call) == Counter(attached)  # once each
        outage_over.set()
        start = len(calls)
        while len(calls) < start + 2:  # renewed again once the first came back
            attached.ticked.clear()
            await attached.ticked.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
