"""The first hop of a federated push: from ``push()`` to its request handed to grpc on
the link's ``PushStream`` (the call's ``write``), and to its answer, with the stream's
writer started eagerly (how it is) and as a plain task (how it was), in interleaved
rounds on one gateway.

Each round is ``--rate`` single pushes a second over 10 federated queues for
``--seconds``, beside an at-most-once consumer of each queue (as in
``federation_bench.py``: the client's event loop has deliveries to handle too); the
first second is not counted. Starts its own two redis-servers and gateway.

    .venv/bin/python bench/push_stream_hop.py
    .venv/bin/python bench/push_stream_hop.py --rounds 5 --rate 500
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc.aio._call as grpc_calls

import busmq.federation.push_stream as push_stream
from _flow import percentile  # bench/ is sys.path[0]
from _redis import local_redis
from busmq import Bus, BusSettings, Mode, Queue
from busmq.federation import FederationSettings, FederationTarget
from federation_bench import SECRET, start_gateway

WRITERS: dict[str, Callable[..., Any]] = {
    "eager": push_stream.start_eagerly,
    "task": lambda coro, name=None: asyncio.create_task(coro, name=name),
}


class Probe:
    """Times each push, keyed by its payload, at ``write``."""

    def __init__(self) -> None:
        self.started: dict[bytes, float] = {}
        self.to_write = array("q")
        self.answered = array("q")
        self.recording = False
        write = grpc_calls._StreamRequestMixin.write

        async def timed_write(call: Any, request: Any) -> None:
            started = self.started.pop(request.push.messages[0].payload, None)
            if started is not None and self.recording:
                self.to_write.append(int((time.perf_counter() - started) * 1e9))
            await write(call, request)

        grpc_calls._StreamRequestMixin.write = timed_write  # type: ignore[method-assign]

    async def push(self, queue: Queue, payload: bytes) -> None:
        started = self.started[payload] = time.perf_counter()
        await queue.push(payload)
        if self.recording:
            self.answered.append(int((time.perf_counter() - started) * 1e9))


async def one_round(queues: list[Queue], writer: str, args: argparse.Namespace) -> list[float]:
    push_stream.start_eagerly = WRITERS[writer]  # type: ignore[assignment]
    probe = PROBE
    probe.to_write, probe.answered = array("q"), array("q")
    inflight: set[asyncio.Task[None]] = set()
    started = time.perf_counter()
    sent = 0
    while (now := time.perf_counter()) - started < args.seconds:
        probe.recording = now - started >= 1.0
        due = started + sent / args.rate
        if due > now:
            await asyncio.sleep(due - now)
        payload = b"%s-%012d" % (writer.encode(), sent)
        task = asyncio.create_task(probe.push(queues[sent % len(queues)], payload))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        sent += 1
    await asyncio.gather(*inflight)
    probe.recording = False
    return [
        percentile(values, q) * 1000  # ms -> us
        for values in (probe.to_write, probe.answered)
        for q in (0.5, 0.99, 0.999)
    ]


async def consume(queue: Queue) -> None:
    async with queue.consume(Mode.AT_MOST_ONCE, prefetch=500) as consumer:
        async for _ in consumer:
            pass


async def main(args: argparse.Namespace) -> None:
    with local_redis() as redis_a, local_redis() as redis_b, tempfile.TemporaryDirectory() as tmp:
        gateway, port = await start_gateway(redis_a.url)
        bus = Bus(BusSettings(redis_urls=(redis_b.url,)))
        consumers: list[asyncio.Task[None]] = []
        try:
            await bus.connect()
            url = f"http://127.0.0.1:{port}"
            bus.configure_federation(
                FederationSettings(
                    targets=[FederationTarget(url, secret=SECRET)],
                    outbox_path=Path(tmp) / "outbox.sqlite3",
                )
            )
            queues = [bus.federate(f"hop-{i}", url) for i in range(10)]
            for queue in queues:
                await queue.attach(ttl=60)
            consumers = [asyncio.create_task(consume(q)) for q in queues]
            figures: dict[str, list[list[float]]] = {w: [] for w in WRITERS}
            for number in range(args.rounds):
                order = list(WRITERS) if number % 2 == 0 else list(reversed(WRITERS))
                for writer in order:
                    figures[writer].append(await one_round(queues, writer, args))
        finally:
            for task in consumers:
                task.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
            await bus.close()
            gateway.send_signal(signal.SIGTERM)
            await gateway.wait()
    names = ["to write p50", "p99", "p99.9", "answered p50", "p99", "p99.9"]
    print(
        f"{args.rate:,.0f} pushes/s over 10 federated queues, medians of {args.rounds} rounds (us)"
    )
    print(f"{'writer':<8}" + "".join(f"{n:>14}" for n in names))
    medians = {
        w: [statistics.median(r[i] for r in rows) for i in range(6)] for w, rows in figures.items()
    }
    for writer, values in medians.items():
        print(f"{writer:<8}" + "".join(f"{v:>14.0f}" for v in values))
    ratios = [
        e / t if t else float("nan") for e, t in zip(medians["eager"], medians["task"], strict=True)
    ]
    print(f"{'ratio':<8}" + "".join(f"{r:>13.2f}x" for r in ratios))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


PROBE = Probe()

if __name__ == "__main__":
    if sys.version_info < (3, 12):
        print("eager tasks came with Python 3.12: both writers would be plain tasks here")
    asyncio.run(main(parse()))
