"""Sentinel failover under load: a master SIGKILLed mid-stream while a producer pushes
and an at-least-once consumer acks. Real master, replicas and Sentinels.

With ``replicas=1`` every acknowledged push must be consumed; with ``async`` the test
measures (and prints) how many acknowledged pushes the failover lost: that is the loss
window the documentation quotes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from busmq import Bus, BusError, Durability, Mode
from tests.ha.scenarios import ordered_per_key
from tests.support import loops
from tests.support.heavy import cpu_heavy
from tests.support.sentinel import SentinelGroup
from tests.support.waiting import eventually

# redis-py's asyncio Sentinel client can drop a connection to a Sentinel without closing
# it when a failover breaks a query in flight (redis/redis-py#3201, #3259); the garbage
# collector then warns mid-test. The leak is redis-py's and bounded (one socket per
# broken query); these tests are about loss, not that warning.
pytestmark = [
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
    pytest.mark.usefixtures("collect_sentinel_leaks"),
]

TOTAL = 20_000
PRODUCERS = 16
KILL_AFTER = 6_000

MakeBus = Callable[..., Awaitable[Bus]]


@dataclass
class Run:
    acknowledged: dict[int, int] = field(default_factory=dict)  # n -> id push returned
    retried: set[int] = field(default_factory=set)  # n whose first push failed
    delivered: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # n -> ids
    deliveries: int = 0
    push_errors: int = 0
    events: list[tuple[str, float]] = field(default_factory=list)


async def produce(bus: Bus, run: Run, durability: Durability, killed: asyncio.Event) -> None:
    queue = bus.queue("orders")
    numbers = iter(range(TOTAL))

    async def producer() -> None:
        for n in numbers:
            while True:
                try:
                    ids = await queue.push_batch(
                        [{"n": n}], request_id=f"order-{n}", durability=durability
                    )
                except BusError:  # may be stored: the retry with the same request_id is deduped
                    run.retried.add(n)
                    run.push_errors += 1
                    await asyncio.sleep(0.05)  # back off before the retry
                    continue
                run.acknowledged[n] = ids[0]
                break
            if len(run.acknowledged) >= KILL_AFTER:
                killed.set()

    await asyncio.gather(*(producer() for _ in range(PRODUCERS)))


async def consume(bus: Bus, run: Run) -> None:
    queue = bus.queue("orders")
    async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=200, visibility_timeout=2.0) as consumer:
        async for delivery in consumer:
            run.deliveries += 1
            run.delivered[delivery.data["n"]].add(delivery.id)
            # An ack lost in the failover: the delivery comes again (a redelivery).
            with contextlib.suppress(BusError):
                await delivery.ack()


async def failover_under_load(
    group: SentinelGroup, make_bus: MakeBus, durability: Durability
) -> Run:
    """Push TOTAL messages while consuming, SIGKILL the master after KILL_AFTER were
    acknowledged, and consume until the queue is empty on the new master."""
    run = Run()
    bus = await make_bus([group.url], durability=durability)
    started = time.monotonic()
    bus.events.on(lambda e: run.events.append((e.kind, time.monotonic() - started)))
    async with bus.queue("orders") as queue:
        killed = asyncio.Event()
        consumer = asyncio.create_task(consume(bus, run))
        producer = asyncio.create_task(produce(bus, run, durability, killed))
        try:
            await killed.wait()
            await group.kill_master()
            await asyncio.wait_for(producer, 120)

            async def drained() -> bool:
                return await queue.count() == 0  # every stored message consumed and acked

            await eventually(drained, timeout=60, what="queue drained on the new master")
        finally:
            for task in (producer, consumer):
                task.cancel()
            await asyncio.gather(producer, consumer, return_exceptions=True)
    return run


@pytest.mark.slow
async def test_replicas_1_loses_no_acknowledged_push_across_a_failover(
    sentinel_group: SentinelGroup, make_bus: MakeBus
) -> None:
    run = await failover_under_load(sentinel_group, make_bus, Durability(replicas=1))

    assert len(run.acknowledged) == TOTAL
    missing = [n for n, i in run.acknowledged.items() if i not in run.delivered.get(n, ())]
    assert not missing, f"{len(missing)} acknowledged pushes never consumed, e.g. {missing[:5]}"
    # A message is stored once: a second id for the same message is only possible when
    # its first push failed ambiguously and was lost with the old master, then retried.
    twice = {n for n, ids in run.delivered.items() if len(ids) > 1}
    assert twice <= run.retried, f"stored twice without a retry: {sorted(twice - run.retried)[:5]}"
    kinds = [k for k, _ in run.events]
    assert "offline" in kinds
    assert "online" in kinds[kinds.index("offline") :]
    offline = next(t for k, t in run.events if k == "offline")
    online = next(t for k, t in run.events if k == "online" and t > offline)
    print(
        f"\nreplicas=1: {TOTAL} acknowledged, all consumed; {run.push_errors} push errors "
        f"retried; {run.deliveries - len(run.delivered)} redeliveries; "
        f"offline for {online - offline:.2f}s"
    )


@pytest.mark.slow
async def test_async_durability_reports_its_loss_window(
    sentinel_group: SentinelGroup, make_bus: MakeBus
) -> None:
    run = await failover_under_load(sentinel_group, make_bus, Durability.ASYNC)
    assert len(run.acknowledged) == TOTAL
    lost = [n for n, i in run.acknowledged.items() if i not in run.delivered.get(n, ())]
    # Not asserted to be zero: acknowledged by the master alone, what it had not yet
    # sent to the promoted replica is gone. This is the figure the docs quote.
    print(f"\nasync: {len(lost)} of {TOTAL} acknowledged pushes lost in the failover")


@cpu_heavy
@pytest.mark.slow
@pytest.mark.timeout(300)  # ten failovers; its own waits fail first, naming the one that stalled
async def test_the_readme_loops_ride_through_ten_sentinel_failovers(
    sentinel_group: SentinelGroup, make_bus: MakeBus
) -> None:
    # The README's producer (request ids, retried on an error) and consumer (no error
    # handling at all) while the master is SIGKILLed ten times, each time restarted to
    # rejoin as a replica: the consumer's loop never raises, nothing acknowledged is lost.
    bus = await make_bus([sentinel_group.url], durability="replicas=1")
    ledger = loops.Ledger()
    outages: list[str] = []
    bus.events.on(lambda e: outages.append(e.kind) if e.kind in ("offline", "online") else None)
    stop = asyncio.Event()
    async with bus.queue("riding") as queue:
        consumer = asyncio.create_task(loops.consume(bus, "riding", ledger))
        producer = asyncio.create_task(loops.produce(bus, "riding", ledger, range(10**9), stop))
        try:
            for _ in range(10):
                mark = len(ledger.acknowledged) + 300
                await eventually(lambda m=mark: len(ledger.acknowledged) >= m, timeout=60)  # type: ignore[misc]
                old = await sentinel_group.kill_master()
                await sentinel_group.rejoin(old)
                await sentinel_group.wait_replicas_linked()
                await sentinel_group.wait_sentinels_can_promote()
                assert not consumer.done(), consumer
            stop.set()
            await asyncio.wait_for(producer, 60)
            await queue.push({"n": loops.END})
            await asyncio.wait_for(consumer, 60)  # raises what the loop raised
        finally:
            stop.set()
            for task in (producer, consumer):
                task.cancel()
            await asyncio.gather(producer, consumer, return_exceptions=True)
    assert not ledger.missing(), f"{len(ledger.missing())} acknowledged pushes never consumed"
    assert not ledger.stored_twice_without_a_retry()
    redeliveries = ledger.deliveries - sum(len(ids) for ids in ledger.delivered.values())
    # At most what a consumer held (read-ahead and unacked) at each kill comes again.
    assert redeliveries <= 10 * 3 * 50, redeliveries
    print(
        f"\n10 failovers: {len(ledger.acknowledged)} acknowledged, all consumed; "
        f"{len(ledger.push_errors)} push errors retried; {redeliveries} redeliveries; "
        f"{outages.count('offline')} offline events"
    )


@pytest.mark.slow
async def test_ordered_keys_keep_push_order_and_lose_nothing_across_a_sentinel_failover(
    sentinel_group: SentinelGroup, make_bus: MakeBus
) -> None:
    # The ordering's state is queue data changed by the queue's scripts: the promoted
    # replica carries it as far as it was replicated. What the old master did and did not
    # replicate comes again (at-least-once): per key, first handlings stay in push order
    # and nothing is lost (ordered_per_key asserts both). A delivery the old master made
    # and the replica never saw is not known to hold its key on the new master; the
    # consumers give back what they read ahead once the Sentinels name the new master, so
    # no such delivery is handed out beside a redelivery of an earlier message of its key.
    bus = await make_bus([sentinel_group.url], durability="replicas=1")

    async def failover() -> None:
        old = await sentinel_group.kill_master()
        await sentinel_group.rejoin(old)
        await sentinel_group.wait_replicas_linked()

    overlaps, redelivered = await ordered_per_key(bus, failover)
    print(f"\nordered across a failover: {redelivered} redeliveries")
    assert overlaps == [], overlaps


@pytest.mark.slow
async def test_a_consumer_gives_back_its_read_ahead_when_the_master_moves(
    sentinel_group: SentinelGroup, make_bus: MakeBus
) -> None:
    # What a consumer read ahead from the old master may be unknown to the new one (the
    # read not replicated) or known as delivered: either way it is given back, and comes
    # again through a read of the new master, instead of from the read-ahead.
    bus = await make_bus([sentinel_group.url], durability="replicas=1")
    queue = bus.queue("read-ahead")
    await queue.attach()
    ids = await queue.push_batch([f"m{i}" for i in range(20)])
    async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=20) as consumer:
        first = await anext(consumer)
        assert (first.id, first.delivery_count) == (ids[0], 1)
        await first.ack()
        await sentinel_group.wait_replicas_linked()  # the read and the ack replicated
        await sentinel_group.kill_master()
        # A push returns once the shard is online on the new master (its probe, which
        # names the new master, comes first). Not confirmed by a replica: the new master's
        # may still be resyncing (1 s was not always enough on a loaded machine).
        ids.append(await queue.push("after", durability="async"))
        second = await asyncio.wait_for(anext(consumer), 30)
        # Given back, read again (twice given back when a read was in flight as the first
        # give-back landed: needless, not harmful); from the read-ahead it would be 1.
        assert second.id == ids[1] and second.delivery_count >= 2
        rest = [second]
        while len(rest) < 20:
            rest.append(await asyncio.wait_for(anext(consumer), 30))
            await rest[-1].ack()
        await second.ack()
    assert [d.id for d in rest] == ids[1:]
