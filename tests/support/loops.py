"""A producer and a consumer written as the README shows them, for the fault tests that
ride through failovers and restarts: the consumer's loop has no error handling at all,
so any exception an outage lets through ends it, and the test sees it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

from busmq import Bus, BusError, Mode


@dataclass
class Ledger:
    acknowledged: dict[int, int] = field(default_factory=dict)  # n -> id its push returned
    retried: set[int] = field(default_factory=set)  # n whose push raised and was sent again
    push_errors: list[BusError] = field(default_factory=list)
    delivered: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    deliveries: int = 0

    def missing(self) -> list[int]:
        """Acknowledged pushes never consumed."""
        return [n for n, i in self.acknowledged.items() if i not in self.delivered.get(n, ())]

    def stored_twice_without_a_retry(self) -> set[int]:
        twice = {n for n, ids in self.delivered.items() if len(ids) > 1}
        return twice - self.retried


async def produce(
    bus: Bus, queue_name: str, ledger: Ledger, numbers: range, stop: asyncio.Event | None = None
) -> None:
    """Push each number with its request id (until ``stop``); a push that raised may have
    been stored, so it is sent again with the same id (stored once)."""
    queue = bus.queue(queue_name)
    for n in numbers:
        if stop is not None and stop.is_set():
            return
        while True:
            try:
                ledger.acknowledged[n] = await queue.push({"n": n}, request_id=f"{queue_name}-{n}")
                break
            except BusError as exc:
                ledger.push_errors.append(exc)
                ledger.retried.add(n)
                await asyncio.sleep(0.05)  # back off before the retry


END = -1
"""The number of the message a test pushes last: the consumer returns once it has it and
every acknowledged push (redeliveries may come after it)."""


async def consume(bus: Bus, queue_name: str, ledger: Ledger) -> None:
    """The README's at-least-once loop, as written: no try, no suppress."""
    queue = bus.queue(queue_name)
    async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=50, visibility_timeout=5.0) as c:
        async for delivery in c:
            ledger.deliveries += 1
            ledger.delivered[delivery.data["n"]].add(delivery.id)
            await delivery.ack()
            if END in ledger.delivered and not ledger.missing():
                return
