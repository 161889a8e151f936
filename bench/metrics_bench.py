"""What a metrics scrape costs Redis: a bus of ``--queues`` (10,000) queues, scraped.

Against one local ``redis-server`` the script starts on a free loopback port, it creates
the queues (each with a few messages; every tenth consumed at least once with one
delivery left unacked, so it has a consumer group and a pending entry), then scrapes
:class:`busmq.metrics.BusMetrics` ``--scrapes`` times (each a fresh read, no cache) and
reports per scrape:

- **Redis time**: the ``usec`` of every command Redis ran for the scrape
  (``INFO commandstats`` after ``CONFIG RESETSTAT``): the time the scrape kept Redis
  from serving others. Target: under 1 s for 10,000 queues.
- Redis CPU (from /proc, includes its event loop and network), wall time as the
  scraper sees it, commands issued, and the exposition's size with the default label
  bound (100 queues, the rest summed) and with every queue labelled.

Usage::

    .venv/bin/python bench/metrics_bench.py                 # about half a minute
    .venv/bin/python bench/metrics_bench.py --queues 1000 --scrapes 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, generate_latest

from _redis import local_redis  # bench/ is sys.path[0]
from busmq import Bus, BusSettings, Mode
from busmq.metrics import BusMetrics


async def populate(bus: Bus, count: int) -> None:
    async def one(n: int) -> None:
        queue = bus.queue(f"tenant-{n:05d}.orders")
        await queue.attach(ttl=3600)
        await queue.push_batch([b"x" * 32] * 3)
        if n % 10 == 0:
            async with queue.consume(Mode.AT_LEAST_ONCE, max=1, prefetch=1) as consumer:
                await consumer.__anext__()  # left unacked: one pending entry

    for start in range(0, count, 200):
        await asyncio.gather(*(one(n) for n in range(start, min(start + 200, count))))


async def redis_usec(client: aioredis.Redis) -> tuple[int, int]:
    """Microseconds and calls of every command since the last reset, ``INFO`` itself aside."""
    stats = await client.info("commandstats")
    usec = calls = 0
    for name, fields in stats.items():
        if name != "cmdstat_info":
            usec += int(fields["usec"])
            calls += int(fields["calls"])
    return usec, calls


async def run(args: argparse.Namespace) -> None:
    with local_redis() as server:
        settings = BusSettings(redis_urls=(server.url,))
        async with Bus(settings) as bus:
            started = time.perf_counter()
            await populate(bus, args.queues)
            print(f"{args.queues:,} queues created in {time.perf_counter() - started:.1f} s")
            admin = aioredis.from_url(server.url)
            for max_queues in (100, args.queues + 1):
                registry = CollectorRegistry()
                metrics = BusMetrics(bus, max_queues=max_queues, cache_seconds=0)
                registry.register(metrics)
                redis_ms, cpu_ms, wall_ms, commands, size = [], [], [], [], 0
                for _ in range(args.scrapes):
                    await admin.config_resetstat()
                    cpu = server.cpu_seconds()
                    started = time.perf_counter()
                    await metrics.refresh(force=True)
                    size = len(generate_latest(registry))
                    wall_ms.append((time.perf_counter() - started) * 1000)
                    cpu_ms.append((server.cpu_seconds() - cpu) * 1000)
                    usec, calls = await redis_usec(admin)
                    redis_ms.append(usec / 1000)
                    commands.append(calls)
                label = "all queues labelled" if max_queues > args.queues else "labels for 100"
                p50 = statistics.median
                print(
                    f"scrape ({label}): Redis time p50 {p50(redis_ms):.0f} ms "
                    f"(max {max(redis_ms):.0f} ms; target < 1000 ms), Redis CPU p50 "
                    f"{p50(cpu_ms):.0f} ms, wall p50 {p50(wall_ms):.0f} ms, "
                    f"{p50(commands):,.0f} commands, exposition {size / 1024:.0f} KiB"
                )
            await admin.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=5)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
