"""Channel round-trip latency and request/reply throughput on the core bus.

- Channel: a client end sends at ``--rate`` req/s (1,000) to a server end that echoes
  each message back; the round-trip time is measured per message (p50/p99).
- Request/reply: ``--concurrency`` requesters call a service whose handler returns the
  request, as fast as they can for ``--seconds``; requests/s and p50/p99 latency.

One ``redis-server`` started by the script (free loopback port), one bus process.

    .venv/bin/python bench/channel_bench.py
    .venv/bin/python bench/channel_bench.py --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import time
from array import array
from typing import Any

from _redis import local_redis  # bench/ is sys.path[0]
from busmq import Bus, BusSettings, Delivery
from busmq.service import Request


def percentiles(samples: array[int]) -> tuple[float, float]:
    ordered = sorted(samples)
    if not ordered:
        return float("nan"), float("nan")
    return ordered[len(ordered) // 2] / 1e6, ordered[int(len(ordered) * 0.99)] / 1e6


async def channel_round_trips(bus: Bus, rate: float, seconds: float) -> tuple[int, float, float]:
    server = bus.channel("bench-echo", local="server", remote="client")
    client = bus.channel("bench-echo", local="client", remote="server")

    async def echo(delivery: Delivery) -> None:
        await server.send(delivery.payload)

    await server.connect(handler=echo)
    await client.connect()
    rtts = array("q")
    done = asyncio.Event()

    async def receive() -> None:
        async for delivery in client:
            rtts.append(time.perf_counter_ns() - int(delivery.payload))
            if done.is_set():
                return

    receiver = asyncio.create_task(receive())
    interval = 1.0 / rate
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        due = start + sent * interval
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await client.send(str(time.perf_counter_ns()).encode())
        sent += 1
    await asyncio.sleep(0.5)
    done.set()
    receiver.cancel()
    await asyncio.gather(receiver, return_exceptions=True)
    await client.end()
    p50, p99 = percentiles(rtts)
    return len(rtts), p50, p99


async def request_reply(bus: Bus, concurrency: int, seconds: float) -> tuple[float, float, float]:
    service = bus.service("bench-echo-service")

    async def handler(request: Request) -> Any:
        return request.data

    server = asyncio.create_task(service.serve(handler, concurrency=64))
    requester = bus.service("bench-echo-service")
    latencies = array("q")
    stop = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < stop:
            sent = time.perf_counter_ns()
            await requester.request(b"ping", timeout=10)
            latencies.append(time.perf_counter_ns() - sent)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    server.cancel()
    await asyncio.gather(server, return_exceptions=True)
    await requester.close()
    await service.close()
    p50, p99 = percentiles(latencies)
    return len(latencies) / elapsed, p50, p99


async def main(args: argparse.Namespace) -> None:
    with local_redis() as redis:
        async with Bus(BusSettings(redis_urls=(redis.url,))) as bus:
            count, p50, p99 = await channel_round_trips(bus, args.rate, args.seconds)
            print(
                f"channel round trip @ {args.rate:,.0f} req/s: {count:,} samples, "
                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
            )
            rps, p50, p99 = await request_reply(bus, args.concurrency, args.seconds)
            print(
                f"request/reply, {args.concurrency} concurrent requesters: {rps:,.0f} req/s, "
                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
            )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--concurrency", type=int, default=100)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
