"""Processing controls: their cost on the flood, delayed-delivery lateness, rate accuracy.

Against one local ``redis-server`` the script starts on a free loopback port (no
persistence), in one run:

1. **Flood cost**: at-least-once flood (one producer pushing batches, ``--consumers``
   consumers acking in batches) on a plain queue, then with each control configured:
   ``dlq+retry`` (max_deliveries and a RetryPolicy, never triggered), ``rate-limit`` (a
   queue limit far above the flood), ``key-limit`` (a per-tenant limit far above it, every
   message with the header), ``ttl`` (every message with an expiry). Runs alternate so
   the machine's drift hits all alike; the ratio is against plain in the same round.
2. **Delayed lateness**: messages pushed with delays so that ``--due-rate`` (5,000) fall
   due per second for ``--seconds``; lateness = delivery time - due time, p50/p99.
3. **Rate accuracy**: a queue with a limit of 10, 1,000 and 50,000 msg/s, a full backlog
   and two consumers; delivered rate over ``--seconds`` against the limit (the initial
   burst of one window excluded).

Ordering per key has its own bench: ``bench/ordering_bench.py``.

Usage::

    .venv/bin/python bench/controls_bench.py             # about a minute and a half
    .venv/bin/python bench/controls_bench.py --seconds 3 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Iterator, Sequence

from _redis import local_redis  # bench/ is sys.path[0]
from busmq import Bus, BusSettings, Mode, Queue, RateLimit, RetryPolicy

CONTROLS = ("plain", "dlq+retry", "rate-limit", "key-limit", "ttl")


async def configure(
    queue: Queue, control: str
) -> tuple[Iterator[Sequence[object]], dict[str, float], dict[str, object]]:
    """Turn ``control`` on for ``queue``: the batches to push, the push and consume options."""
    headers = None
    push_options: dict[str, float] = {}
    consume_options: dict[str, object] = {}
    if control == "dlq+retry":
        await queue.set_max_deliveries(5)
        consume_options = {"max_deliveries": 5, "retry_policy": RetryPolicy(initial=1.0)}
    elif control == "rate-limit":
        await queue.set_rate_limit(RateLimit(100_000_000, 1.0))
    elif control == "key-limit":
        await queue.set_rate_limit(RateLimit(100_000_000, 1.0, key="tenant"))
        headers = {"tenant": "acme"}
    elif control == "ttl":
        push_options = {"ttl": 600.0}
    payload = b"x" * 32
    batch = [payload if headers is None else (payload, headers) for _ in range(200)]
    return itertools.repeat(batch), push_options, consume_options


async def flood(bus: Bus, control: str, seconds: float, consumers: int, tag: str) -> float:
    """Messages per second consumed and acked at-least-once with ``control`` on."""
    queue = bus.queue(f"flood-{control.replace('+', '-')}-{tag}")
    await queue.attach()
    batches, push_options, consume_options = await configure(queue, control)
    consumed = 0

    async def produce() -> None:
        while True:
            if (await queue.count()) > 20_000:  # keep a bounded backlog
                await asyncio.sleep(0.005)
                continue
            await queue.push_batch(next(batches), **push_options)  # type: ignore[arg-type]

    async def consume() -> None:
        nonlocal consumed
        async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=200, **consume_options) as c:  # type: ignore[arg-type]
            while True:
                deliveries = await c.next_batch()
                await queue.ack(*(d.id for d in deliveries))
                consumed += len(deliveries)

    tasks = [asyncio.create_task(produce())]
    tasks += [asyncio.create_task(consume()) for _ in range(consumers)]
    await asyncio.sleep(1.0)  # warm-up
    start, before = time.perf_counter(), consumed
    await asyncio.sleep(seconds)
    rate = (consumed - before) / (time.perf_counter() - start)
    for task in tasks:  # a stop message could leave a consumer waiting: cancel them
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await queue.close()
    return rate


async def lateness(bus: Bus, due_rate: int, seconds: float) -> tuple[float, float, int]:
    """p50 and p99 lateness (ms) of messages falling due at ``due_rate`` per second."""
    queue = bus.queue("lateness")
    await queue.attach()
    total = int(due_rate * seconds)
    lead = 4.0  # every message is pushed before the first falls due
    start = time.time()
    dues: dict[int, float] = {}
    step = 1.0 / due_rate
    for first in range(0, total, 500):
        pushes = []
        for n in range(first, min(first + 500, total)):
            due = start + lead + n * step
            pushes.append((n, due))
        ids = await asyncio.gather(*(queue.push(n, delay=due - time.time()) for n, due in pushes))
        for message_id, (_, due) in zip(ids, pushes, strict=True):
            dues[message_id] = due
    late: list[float] = []
    async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=500) as consumer:
        while len(late) < total:
            deliveries = await consumer.next_batch()
            now = time.time()
            late.extend(now - dues[d.id] for d in deliveries)
            await queue.ack(*(d.id for d in deliveries))
    await queue.close()
    late.sort()
    early = sum(1 for x in late if x < -0.002)
    return late[len(late) // 2] * 1000, late[int(len(late) * 0.99)] * 1000, early


async def rate_accuracy(bus: Bus, limit: int, seconds: float) -> float:
    """Delivered msg/s across two consumers, over ``limit``, after the first burst."""
    queue = bus.queue(f"paced-{limit}")
    await queue.attach()
    await queue.set_rate_limit(RateLimit(limit, 1.0))
    backlog = int(limit * (seconds + 2)) + 1000
    for first in range(0, backlog, 5000):
        await queue.push_batch([b"m"] * min(5000, backlog - first))
    stamps: list[float] = []
    stop = asyncio.Event()

    async def consume() -> None:
        async with queue.consume(Mode.AT_MOST_ONCE, prefetch=1000) as c:
            while not stop.is_set():
                batch = await c.next_batch()
                now = time.perf_counter()
                stamps.extend([now] * len(batch))

    tasks = [asyncio.create_task(consume()) for _ in range(2)]
    await asyncio.sleep(1.0 + seconds)
    stop.set()
    await queue.set_rate_limit(None)  # let the consumers see the stop
    await asyncio.gather(*tasks, return_exceptions=True)
    await queue.close()
    begin = stamps[0] + 1.0  # past the burst of one window
    window = [s for s in stamps if begin <= s < begin + seconds]
    return len(window) / seconds / limit


async def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3, help="flood rounds (medians reported)")
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--due-rate", type=int, default=5000)
    args = p.parse_args(argv)
    with local_redis() as redis:
        settings = BusSettings(redis_urls=(redis.url,))
        async with Bus(settings) as bus:
            rates: dict[str, list[float]] = {c: [] for c in CONTROLS}
            for round_ in range(args.rounds):
                for control in CONTROLS:
                    tag = str(round_)
                    rate = await flood(bus, control, args.seconds, args.consumers, tag)
                    rates[control].append(rate)
            print(f"flood, at-least-once, {args.consumers} consumers, medians of {args.rounds}")
            plain = statistics.median(rates["plain"])
            for control in CONTROLS:
                median = statistics.median(rates[control])
                print(f"  {control:<11} {median:>10,.0f} msg/s  {median / plain:5.2f}x plain")
            p50, p99, early = await lateness(bus, args.due_rate, args.seconds)
            print(
                f"delayed delivery at {args.due_rate:,} due/s: lateness p50 {p50:.1f} ms, "
                f"p99 {p99:.1f} ms, early {early}"
            )
            for limit in (10, 1_000, 50_000):
                ratio = await rate_accuracy(bus, limit, args.seconds)
                print(f"rate limit {limit:>6,}/s: delivered {ratio:6.3f}x the limit")


if __name__ == "__main__":
    asyncio.run(main())
