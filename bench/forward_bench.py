"""busmq pipeline-stage benchmark: consume -> push -> ack against ``Delivery.forward``.

A stage reads queue ``src`` (at-least-once) and writes one message per delivery to
``dst``. Three ways, in interleaved rounds in one run (A B C, then C B A, ...), each on
fresh queues holding ``--messages`` messages:

- ``push+ack``: ``await dst.push(...)`` then ``await delivery.ack()`` (at least once);
- ``forward``: ``await delivery.forward(dst, ...)``, both queues on one Redis server
  (one script: push and ack together);
- ``forward outbox``: ``dst`` on a second Redis server, so the forward goes through the
  source's outbox (record, push as an idempotent producer, ack).

``--stages`` consumers run side by side (each awaits one message at a time, as a
handler does). Prints each way's median msgs/s and its ratio to ``push+ack``. Starts
its own redis-servers (free loopback ports, no persistence).

    .venv/bin/python bench/forward_bench.py
    .venv/bin/python bench/forward_bench.py --messages 20000 --stages 4 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _redis import local_redis  # bench/ is sys.path[0]
from busmq import Bus, BusSettings, Delivery, Mode, Queue

Stage = Callable[[Delivery, Queue], Awaitable[Any]]


async def push_and_ack(delivery: Delivery, dst: Queue) -> None:
    await dst.push(delivery.payload)
    await delivery.ack()


async def forward(delivery: Delivery, dst: Queue) -> None:
    await delivery.forward(dst, delivery.payload)


async def run_way(src: Queue, dst: Queue, stage: Stage, messages: int, stages: int) -> float:
    """Messages per second through ``stage``, from the first read to the last write."""
    await src.push_batch([b"x" * 100] * messages)
    done = asyncio.Event()
    handled = 0

    async def worker() -> None:
        nonlocal handled
        async with src.consume(Mode.AT_LEAST_ONCE, prefetch=50) as consumer:
            async for delivery in consumer:
                await stage(delivery, dst)
                handled += 1
                if handled >= messages:
                    done.set()

    started = time.perf_counter()
    tasks = [asyncio.create_task(worker()) for _ in range(stages)]
    await done.wait()
    elapsed = time.perf_counter() - started
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    stored = await dst.count()
    if stored != messages:
        raise RuntimeError(f"{dst.name} holds {stored} messages, not {messages}")
    return messages / elapsed


async def main_async(args: argparse.Namespace) -> dict[str, list[float]]:
    with local_redis() as one, local_redis() as other:
        settings = dict(block_seconds=0.2)
        near = Bus(BusSettings(redis_urls=(one.url,), **settings))
        far = Bus(BusSettings(redis_urls=(other.url,), **settings))
        await near.connect()
        await far.connect()
        ways: dict[str, tuple[Stage, Bus]] = {
            "push+ack": (push_and_ack, near),
            "forward": (forward, near),
            "forward outbox": (forward, far),
        }
        figures: dict[str, list[float]] = {name: [] for name in ways}
        try:
            order = list(ways)
            for round_ in range(args.rounds):
                for name in order if round_ % 2 == 0 else reversed(order):
                    stage, target_bus = ways[name]
                    tag = f"{name.replace(' ', '-').replace('+', '-')}-{round_}"
                    src, dst = near.queue(f"src-{tag}"), target_bus.queue(f"dst-{tag}")
                    async with src, dst:
                        rate = await run_way(src, dst, stage, args.messages, args.stages)
                    await src.close()
                    await dst.close()
                    figures[name].append(rate)
                    print(f"round {round_ + 1} {name:<15} {rate:>10,.0f} msg/s", flush=True)
        finally:
            await near.close()
            await far.close()
    return figures


def report(figures: dict[str, list[float]]) -> str:
    base = statistics.median(figures["push+ack"])
    lines = [f"{'way':<16}{'median msg/s':>14}{'vs push+ack':>14}"]
    for name, values in figures.items():
        value = statistics.median(values)
        lines.append(f"{name:<16}{value:>14,.0f}{value / base:>13.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--stages", type=int, default=1, help="consumers side by side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    figures = asyncio.run(main_async(args))
    print(report(figures))
    if args.json:
        rows = [
            {"label": f"{name} flood", "consumed/s": statistics.median(values)}
            for name, values in figures.items()
        ]
        args.json.write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
