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
    With ``--order-key HEADER`` (a queue ordered per key), each delivery is logged as
    ``S <id> <delivery count> <key> <t>`` when its handling starts and ``E <id> <t>``
    when it ends (before the ack), and an ack lost to an outage as ``X <id> <count>``.

python bus_worker.py forward URL QUEUE OUT --settings JSON --to-url URL2 --to QUEUE2
                     [--visibility S] [--prefetch N]
    A pipeline stage: consume QUEUE at-least-once and forward each delivery to QUEUE2
    (on the Redis at URL2: the same server or another one) as the JSON object
    ``{"src": id, "pid": pid, "first": delivery_count == 1}``. Appends ``D`` lines as
    above and ``F <id> <delivery count> <forwarded: 1 or 0>`` after each forward.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import time
from typing import IO

from busmq import Bus, BusSettings, BusUnavailableError, Mode, UnknownMessageError


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
                if args.order_key:
                    key = delivery.headers.get(args.order_key, "-")
                    count = delivery.delivery_count
                    _line(out, f"S {delivery.id} {count} {key} {time.time():.6f}")
                else:
                    _line(out, f"D {delivery.id} {delivery.delivery_count} {time.time():.6f}")
                if args.delay:
                    await asyncio.sleep(args.delay)  # simulated processing time
                if args.order_key:
                    _line(out, f"E {delivery.id} {time.time():.6f}")
                try:
                    await queue.ack(delivery.id)
                except BusUnavailableError:
                    if not args.order_key:
                        raise
                    _line(out, f"X {delivery.id} {delivery.delivery_count}")
                except UnknownMessageError:
                    _line(out, f"U {delivery.id} {delivery.delivery_count}")
                else:
                    _line(out, f"A {delivery.id} {delivery.delivery_count}")


async def forward(args: argparse.Namespace, out: IO[str]) -> None:
    to_settings = dataclasses.replace(_settings(args), redis_urls=(args.to_url,))
    async with Bus(_settings(args)) as bus, Bus(to_settings) as to_bus:
        target = (bus if args.to_url == args.url else to_bus).queue(args.to)
        queue = bus.queue(args.queue)
        consumer = queue.consume(
            Mode.AT_LEAST_ONCE, prefetch=args.prefetch, visibility_timeout=args.visibility
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
        pid = os.getpid()
        async with consumer:
            async for delivery in consumer:
                count = delivery.delivery_count
                _line(out, f"D {delivery.id} {count} {time.time():.6f}")
                value = {"src": delivery.id, "pid": pid, "first": count == 1}
                forwarded = await delivery.forward(target, value)
                _line(out, f"F {delivery.id} {count} {int(forwarded)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bus_worker")
    sub = parser.add_subparsers(dest="command", required=True)
    p_attach = sub.add_parser("attach")
    p_consume = sub.add_parser("consume")
    p_forward = sub.add_parser("forward")
    for p in (p_attach, p_consume, p_forward):
        p.add_argument("url")
        p.add_argument("queue")
        p.add_argument("--settings", default="{}", help="BusSettings keyword overrides (JSON)")
    p_attach.add_argument("--ttl", type=float, default=30.0)
    p_consume.add_argument("out")
    p_consume.add_argument("--visibility", type=float, default=1.0)
    p_consume.add_argument("--prefetch", type=int, default=20)
    p_consume.add_argument("--delay", type=float, default=0.0)
    p_consume.add_argument("--order-key", default="")
    p_forward.add_argument("out")
    p_forward.add_argument("--to-url", required=True)
    p_forward.add_argument("--to", required=True)
    p_forward.add_argument("--visibility", type=float, default=1.0)
    p_forward.add_argument("--prefetch", type=int, default=20)
    args = parser.parse_args(argv)
    if args.command == "attach":
        asyncio.run(attach(args))
    elif args.command == "forward":
        with open(args.out, "a", buffering=1) as out:
            asyncio.run(forward(args, out))
    else:
        with open(args.out, "a", buffering=1) as out:
            asyncio.run(consume(args, out))


if __name__ == "__main__":
    main()
