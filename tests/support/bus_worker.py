"""A busmq client in its own process, for the fault tests (killed with SIGKILL there).

python bus_worker.py attach URL QUEUE --settings JSON --ttl SECONDS
    Attach to QUEUE, print ``attached``, and hold the attachment (renewing its
    lease) until SIGTERM (detach and exit 0) or SIGKILL.

python bus_worker.py consume URL QUEUE OUT --settings JSON [--visibility S]
                     [--prefetch N] [--delay S]
    Consume QUEUE at-least-once, acking every delivery with ``queue.ack(id)`` after
    ``--delay`` seconds of "processing". One line per event is appended to OUT and
    flushed at once, so the lines survive a SIGKILL:

        C <consumer name>           the consumer started
        D <id> <delivery count> <t> a delivery was handed to the worker (t: Unix time)
        A <id> <delivery count>     ``queue.ack`` succeeded (the only successful ack)
        U <id> <delivery count>     ``queue.ack`` raised UnknownMessageError

    SIGTERM stops the consumer; the worker finishes what it fetched and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import IO

from busmq import Bus, BusSettings, Mode, UnknownMessageError


def _settings(args: argparse.Namespace) -> BusSettings:
    overrides = json.loads(args.settings)
    return BusSettings(redis_urls=(args.url,), **overrides)


async def attach(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Bus(_settings(args)) as bus:
        queue = bus.queue(args.queue)
        await queue.attach(ttl=args.ttl)
        print("attached", flush=True)
        await stop.wait()


def _line(out: IO[str], text: str) -> None:
    out.write(text + "\n")
    out.flush()


async def consume(args: argparse.Namespace, out: IO[str]) -> None:
    async with Bus(_settings(args)) as bus, bus.queue(args.queue) as queue:
        consumer = queue.consume(
            Mode.AT_LEAST_ONCE, prefetch=args.prefetch, visibility_timeout=args.visibility
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
        async with consumer:
            _line(out, f"C {consumer.name}")
            async for delivery in consumer:
                _line(out, f"D {delivery.id} {delivery.delivery_count} {time.time():.6f}")
                if args.delay:
                    await asyncio.sleep(args.delay)  # simulated processing time
                try:
                    await queue.ack(delivery.id)
                except UnknownMessageError:
                    _line(out, f"U {delivery.id} {delivery.delivery_count}")
                else:
                    _line(out, f"A {delivery.id} {delivery.delivery_count}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bus_worker")
    sub = parser.add_subparsers(dest="command", required=True)
    p_attach = sub.add_parser("attach")
    p_consume = sub.add_parser("consume")
    for p in (p_attach, p_consume):
        p.add_argument("url")
        p.add_argument("queue")
        p.add_argument("--settings", default="{}", help="BusSettings keyword overrides (JSON)")
    p_attach.add_argument("--ttl", type=float, default=30.0)
    p_consume.add_argument("out")
    p_consume.add_argument("--visibility", type=float, default=1.0)
    p_consume.add_argument("--prefetch", type=int, default=20)
    p_consume.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.command == "attach":
        asyncio.run(attach(args))
    else:
        with open(args.out, "a", buffering=1) as out:
            asyncio.run(consume(args, out))


if __name__ == "__main__":
    main()
