"""Ordering per key: what it costs, against the same messages on a queue that is not
ordered, in one run (``core_bench.py --modes ordered`` runs it too).

Every message carries header ``customer``, one of ``--keys`` (10,000) keys at random;
``plain`` is a queue that is not ordered, ``ordered`` one ordered per that header. Both
at-least-once, ``--consumers`` (4) consumers acking each batch they get. Rounds are
interleaved so that the machine's drift hits both alike; medians are reported.

1. **Flood**: ``--producers`` (2) producers push batches of ``--batch`` as fast as they
   can while the backlog stays under ``--window``; the consumers' rate over ``--seconds``.
2. **Drain**: ``--drain`` (100,000) messages pushed first, then the consumers start: the
   time to settle them all, and Redis's CPU per message (``INFO cpu``). This is the
   consumers' capacity alone, which the flood shares with the producers.
3. **Paced** at ``--rate`` (5,000 msg/s): latency from push to delivery, p50/p99/p99.9,
   plain against ordered; then ordered with a hot key (as many messages again, all of one
   key): the other keys' delivered rate and latency against ordered without it.

Usage::

    .venv/bin/python bench/ordering_bench.py                  # about a minute and a half
    .venv/bin/python bench/ordering_bench.py --rounds 1 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from _redis import local_redis  # bench/ is sys.path[0]
from busmq import Bus, BusSettings, Mode, Queue

Batch = list[tuple[bytes, dict[str, str]]]


def keyed_batches(keys: int, size: int, hot: bool = False) -> list[Batch]:
    """50 batches of ``size`` messages, each of one of ``keys`` keys at random (with
    ``hot``, as many messages again of key ``hot``)."""
    rng = random.Random(39)
    batches = []
    for _ in range(50):
        batch = [(b"x" * 32, {"customer": str(rng.randrange(keys))}) for _ in range(size)]
        if hot:
            batch += [(b"h" * 32, {"customer": "hot"})] * size
        batches.append(batch)
    return batches


async def _queue(bus: Bus, name: str, ordered: bool) -> Queue:
    queue = bus.queue(name)
    await queue.attach()
    if ordered:
        await queue.set_ordering("customer")
    return queue


class Settled:
    """How many messages the consumers settled, and a wake-up on each batch."""

    def __init__(self) -> None:
        self.count = 0
        self.moved = asyncio.Event()

    def add(self, n: int) -> None:
        self.count += n
        self.moved.set()

    async def wait(self) -> None:
        self.moved.clear()
        await self.moved.wait()


async def _consume(queue: Queue, prefetch: int, settled: Settled) -> None:
    async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=prefetch) as consumer:
        while True:
            deliveries = await consumer.next_batch()
            await queue.ack(*(d.id for d in deliveries))
            settled.add(len(deliveries))


async def _stop(tasks: Sequence[asyncio.Task[None]], queue: Queue) -> None:
    for task in tasks:  # a stop message could leave a consumer waiting: cancel them
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await queue.close()


async def flood(
    bus: Bus, raw: aioredis.Redis, args: argparse.Namespace, ordered: bool, tag: str
) -> tuple[float, float, float]:
    """Messages per second settled with producers and consumers running together, and
    the CPU per message in microseconds of this process (producers and consumers) and
    of Redis: which of the two limits the flood."""
    queue = await _queue(bus, f"flood-{int(ordered)}-{tag}", ordered)
    batches = itertools.cycle(keyed_batches(args.keys, args.batch))
    settled, pushed = Settled(), 0

    async def produce() -> None:
        nonlocal pushed
        while True:
            while pushed - settled.count > args.window:
                await settled.wait()
            pushed += args.batch
            await queue.push_batch(next(batches))

    tasks = [asyncio.create_task(produce()) for _ in range(args.producers)]
    tasks += [
        asyncio.create_task(_consume(queue, args.prefetch, settled)) for _ in range(args.consumers)
    ]
    await asyncio.sleep(args.warmup)
    start, before = time.perf_counter(), settled.count
    client, server = time.process_time(), await _redis_cpu(raw)
    await asyncio.sleep(args.seconds)
    done = settled.count - before
    rate = done / (time.perf_counter() - start)
    client, server = time.process_time() - client, await _redis_cpu(raw) - server
    await _stop(tasks, queue)
    return rate, client / done * 1e6, server / done * 1e6


async def _redis_cpu(raw: aioredis.Redis) -> float:
    cpu = await raw.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def drain(
    bus: Bus, raw: aioredis.Redis, args: argparse.Namespace, ordered: bool, tag: str
) -> tuple[float, float]:
    """A backlog of ``--drain`` messages settled by the consumers alone: msg/s, and
    Redis's CPU per message in microseconds."""
    queue = await _queue(bus, f"drain-{int(ordered)}-{tag}", ordered)
    batches = itertools.cycle(keyed_batches(args.keys, args.batch))
    for _ in range(0, args.drain, args.batch):
        await queue.push_batch(next(batches))
    total = (args.drain + args.batch - 1) // args.batch * args.batch
    settled = Settled()
    cpu, start = await _redis_cpu(raw), time.perf_counter()
    tasks = [
        asyncio.create_task(_consume(queue, args.prefetch, settled)) for _ in range(args.consumers)
    ]
    while settled.count < total:
        await settled.wait()
    elapsed = time.perf_counter() - start
    cpu = await _redis_cpu(raw) - cpu
    await _stop(tasks, queue)
    return total / elapsed, cpu / total * 1e6


def _ms(ordered: Sequence[float], q: float) -> float:
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)] * 1000


async def paced(
    bus: Bus, args: argparse.Namespace, ordered: bool, hot: bool, tag: str
) -> tuple[float, float, float, float]:
    """``--rate`` msg/s (with ``hot``, as many again of one key): the other keys'
    delivered msg/s and latency from push to delivery, p50/p99/p99.9 in ms."""
    queue = await _queue(bus, f"paced-{int(ordered)}{int(hot)}-{tag}", ordered)
    tick = 0.005
    batches = itertools.cycle(keyed_batches(args.keys, max(1, round(args.rate * tick)), hot))
    pushed: dict[int, float] = {}
    latencies: list[float] = []

    async def produce() -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            now = time.perf_counter()
            batch = next(batches)
            for message_id, (_, headers) in zip(await queue.push_batch(batch), batch, strict=True):
                if headers["customer"] != "hot":
                    pushed[message_id] = now
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def consume() -> None:
        async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=args.prefetch) as consumer:
            while True:
                deliveries = await consumer.next_batch()
                now = time.perf_counter()
                latencies.extend(now - pushed.pop(d.id) for d in deliveries if d.id in pushed)
                await queue.ack(*(d.id for d in deliveries))

    tasks = [asyncio.create_task(produce())]
    tasks += [asyncio.create_task(consume()) for _ in range(args.consumers)]
    await asyncio.sleep(args.warmup)
    latencies.clear()
    start = time.perf_counter()
    await asyncio.sleep(args.seconds)
    measured, elapsed = sorted(latencies), time.perf_counter() - start
    await _stop(tasks, queue)
    return len(measured) / elapsed, _ms(measured, 0.5), _ms(measured, 0.99), _ms(measured, 0.999)


def _median(runs: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.median(run[i] for run in runs) for i in range(len(runs[0]))]


async def run(url: str, args: argparse.Namespace) -> str:
    """Every figure against the Redis at ``url``; the report's text."""
    floods: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    drains: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    names = {"plain": (False, False), "ordered": (True, False), "ordered, hot key": (True, True)}
    paces: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
    raw = aioredis.from_url(url)
    try:
        async with Bus(BusSettings(redis_urls=(url,))) as bus:
            for round_ in range(args.rounds):
                tag = str(round_)
                for ordered in (False, True):
                    floods[ordered].append(await flood(bus, raw, args, ordered, tag))
                    drains[ordered].append(await drain(bus, raw, args, ordered, tag))
                for name, (ordered, hot) in names.items():
                    paces[name].append(await paced(bus, args, ordered, hot, tag))
    finally:
        await raw.aclose()
    plain_flood, plain_client, plain_server = _median(floods[False])
    ordered_flood, ordered_client, ordered_server = _median(floods[True])
    plain_rate, plain_cpu = _median(drains[False])
    ordered_rate, ordered_cpu = _median(drains[True])
    lines = [
        f"ordering per key: {args.keys:,} keys, {args.consumers} consumers, at-least-once, "
        f"medians of {args.rounds} interleaved rounds",
        f"  flood ({args.producers} producers)  plain {plain_flood:>9,.0f} msg/s   ordered "
        f"{ordered_flood:>9,.0f} msg/s   {ordered_flood / plain_flood:4.2f}x   client CPU "
        f"{plain_client:.1f} / {ordered_client:.1f}, Redis CPU {plain_server:.1f} / "
        f"{ordered_server:.1f} us per message",
        f"  drain {args.drain:,}        plain {plain_rate:>9,.0f} msg/s   ordered "
        f"{ordered_rate:>9,.0f} msg/s   {ordered_rate / plain_rate:4.2f}x   Redis CPU "
        f"{plain_cpu:.1f} / {ordered_cpu:.1f} us per message",
        f"  paced {args.rate:,.0f} msg/s (hot key: as many messages again, of one key; "
        "its figures are the other keys'):",
    ]
    medians = {name: _median(runs) for name, runs in paces.items()}
    for name, (got, p50, p99, p999) in medians.items():
        against = medians["ordered" if name.endswith("hot key") else "plain"]
        lines.append(
            f"    {name:<17} {got:>8,.0f} msg/s ({got / against[0]:4.2f}x)  p50 {p50:5.2f} ms "
            f"({p50 / against[1]:4.2f}x)  p99 {p99:6.2f} ms ({p99 / against[2]:4.2f}x)  "
            f"p99.9 {p999:6.2f} ms ({p999 / against[3]:4.2f}x)"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """The options of this bench (``prefix`` names them where another script embeds it)."""
    dest = prefix.replace("-", "_")
    p.add_argument(f"--{prefix}keys", dest=f"{dest}keys", type=int, default=10_000)
    p.add_argument(f"--{prefix}consumers", dest=f"{dest}consumers", type=int, default=4)
    p.add_argument(f"--{prefix}producers", dest=f"{dest}producers", type=int, default=2)
    p.add_argument(f"--{prefix}drain", dest=f"{dest}drain", type=int, default=100_000)
    p.add_argument(f"--{prefix}rounds", dest=f"{dest}rounds", type=int, default=3)


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before")
    p.add_argument("--rate", type=float, default=5000.0, help="paced msg/s")
    p.add_argument("--batch", type=int, default=100, help="push batch size")
    p.add_argument("--prefetch", type=int, default=100, help="consumer read batch size")
    p.add_argument("--window", type=int, default=20_000, help="flood backlog cap")
    add_arguments(p)
    return p.parse_args(argv)


async def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(argv)
    with local_redis() as server:
        print(await run(server.url, args))


if __name__ == "__main__":
    asyncio.run(main())
