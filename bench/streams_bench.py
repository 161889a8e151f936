"""busmq gateway stream capacity: N ``Consume`` streams opened at once on one gateway
process, then a steady trickle of pushes across their queues.

For each N it prints: streams started per second (all N opened together, as when every
client reconnects after a deploy), the gateway's RSS per open stream, and the delivery
latency p50/p99 (push to receipt, through the gateway) with the N streams open.

The script starts its own ``redis-server`` (free loopback port) and one gateway:

    .venv/bin/python bench/streams_bench.py                    # 1,000, 5,000 and 10,000
    .venv/bin/python bench/streams_bench.py --streams 2000 --rate 500 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct
import sys
import time
from array import array

import grpc
import psutil
from google.protobuf import duration_pb2

from _flow import percentile  # bench/ is sys.path[0]
from _redis import local_redis
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2
from gateway_bench import AUTH, start_gateway


async def run(n: int, args: argparse.Namespace, redis_url: str) -> str:
    gateway, target = await start_gateway(redis_url, 1)
    process = psutil.Process(gateway.pid)
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(args.connections)]
    stubs = [queue_service_pb2_grpc.QueueServiceStub(c) for c in channels]
    names = [f"streams-{n}-{i}" for i in range(n)]
    latencies = array("q")
    try:
        ttl = duration_pb2.Duration(seconds=600)
        for start in range(0, n, 500):
            await asyncio.gather(
                *(
                    stubs[i % len(stubs)].AttachQueue(
                        pb.AttachQueueRequest(queue=name, ttl=ttl), metadata=AUTH
                    )
                    for i, name in enumerate(names[start : start + 500])
                )
            )
        rss_before = process.memory_info().rss
        opened = time.perf_counter()
        calls = [
            stubs[i % len(stubs)].Consume(pb.ConsumeRequest(queue=name), metadata=AUTH)
            for i, name in enumerate(names)
        ]
        firsts = await asyncio.gather(*(c.read() for c in calls))
        took = time.perf_counter() - opened
        started = sum(1 for f in firsts if f is not grpc.aio.EOF and f.HasField("started"))
        rss_per_stream = (process.memory_info().rss - rss_before) / max(started, 1)

        async def receive(call: grpc.aio.UnaryStreamCall) -> None:  # type: ignore[type-arg]
            while (response := await call.read()) is not grpc.aio.EOF:
                if response.HasField("delivery"):
                    (sent,) = struct.unpack("<q", response.delivery.message.payload)
                    latencies.append(time.perf_counter_ns() - sent)

        readers = [asyncio.create_task(receive(c)) for c in calls]
        interval, deadline = 1 / args.rate, time.perf_counter() + args.seconds
        next_at, i = time.perf_counter(), 0
        while time.perf_counter() < deadline:
            payload = struct.pack("<q", time.perf_counter_ns())
            message = [types_pb2.OutgoingMessage(payload=payload)]
            await stubs[i % len(stubs)].Push(
                pb.PushRequest(queue=names[i % n], messages=message), metadata=AUTH
            )
            i += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.sleep(1.0)  # the last deliveries arrive
        for call in calls:
            call.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)  # ms
        return (
            f"{n:>8,}{started:>9,}{started / took:>12,.0f}{rss_per_stream / 1024:>14.1f}"
            f"{i:>8,}{len(latencies):>11,}{p50:>9.2f}{p99:>9.2f}"
        )
    finally:
        for channel in channels:
            await channel.close()
        gateway.send_signal(signal.SIGTERM)
        await gateway.wait()


async def main(args: argparse.Namespace) -> None:
    print(f"{'streams':>8}{'started':>9}{'started/s':>12}{'RSS KiB/str':>14}"
          f"{'pushed':>8}{'delivered':>11}{'p50 ms':>9}{'p99 ms':>9}")  # fmt: skip
    with local_redis() as redis:
        for n in args.streams:
            print(await run(n, args, redis.url), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--rate", type=float, default=1000.0, help="pushes per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
