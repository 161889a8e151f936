"""The floor under the gateway's latency: bare grpc.aio echo calls on this machine, no
busmq and no Redis, at a fixed rate: a unary call, and a message over a bidirectional
stream (what ``Push`` and ``PushStream`` cost at the least), round trip p50/p99 and CPU
per call on each side.

The server is a second process of this script (``--serve``); ``--pin`` puts it on a
core of its own and this client on the others.

    .venv/bin/python bench/grpc_floor.py                  # 1,000 calls/s for 5 s each
    .venv/bin/python bench/grpc_floor.py --rate 500 --pin
    .venv/bin/python bench/grpc_floor.py --loop uvloop    # both sides on uvloop
    .venv/bin/python bench/grpc_floor.py --server sync    # grpc's thread-pool server
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import time
from array import array
from typing import Any

import grpc
import psutil

from _flow import percentile  # bench/ is sys.path[0]
from _redis import free_port

SERVICE = "bench.Echo"


def _same(data: bytes) -> bytes:
    return data


async def _unary(request: bytes, context: Any) -> bytes:
    return request


async def _bidi(requests: Any, context: Any) -> Any:
    async for request in requests:
        yield request


def _bidi_sync(requests: Any, context: Any) -> Any:
    yield from requests


def serve_sync(port: int) -> None:
    """grpc's thread-pool server: no event loop, a thread per call in progress."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(lambda r, c: r, _same, _same),
        "Stream": grpc.stream_stream_rpc_method_handler(_bidi_sync, _same, _same),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


async def serve(port: int) -> None:
    server = grpc.aio.server()
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary, _same, _same),
        "Stream": grpc.stream_stream_rpc_method_handler(_bidi, _same, _same),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def _cpu_seconds(process: psutil.Process | None = None) -> float:
    if process is not None:
        times = process.cpu_times()
        return float(times.user + times.system)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(port: int, server: psutil.Process, args: argparse.Namespace) -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    unary = channel.unary_unary(f"/{SERVICE}/Unary", _same, _same)
    stream = channel.stream_stream(f"/{SERVICE}/Stream", _same, _same)
    await unary(b"warm-up")
    payload = bytes(args.size)
    print(f"{'call':<28}{'p50 ms':>9}{'p99 ms':>9}{'client us/call':>16}{'server us/call':>16}")
    for kind in ("unary", "bidi stream message"):
        call = stream()
        await call.write(payload)
        await call.read()
        latencies = array("q")
        count = int(args.rate * args.seconds)
        client_cpu, server_cpu = _cpu_seconds(), _cpu_seconds(server)
        started = time.perf_counter()
        for i in range(count):
            due = started + i / args.rate
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            sent = time.perf_counter_ns()
            if kind == "unary":
                await unary(payload)
            else:
                await call.write(payload)
                await call.read()
            latencies.append(time.perf_counter_ns() - sent)
        client_us = (_cpu_seconds() - client_cpu) / count * 1e6
        server_us = (_cpu_seconds(server) - server_cpu) / count * 1e6
        await call.done_writing()
        print(
            f"{kind:<28}{percentile(latencies, 0.5):>9.3f}{percentile(latencies, 0.99):>9.3f}"
            f"{client_us:>16.0f}{server_us:>16.0f}"
        )
    await channel.close()
    print(f"{args.rate:,.0f} calls/s, {args.size}-byte messages; cpus: {os.cpu_count()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument(
        "--server", choices=("aio", "sync"), default="aio", help="grpc.aio, or the thread pool"
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    run: Any = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        run = uvloop.run
    if args.serve and args.server == "sync":
        serve_sync(args.serve)
        return
    if args.serve:
        run(serve(args.serve))
        return
    port = free_port()
    cpus = sorted(os.sched_getaffinity(0))
    pin = None
    if args.pin and len(cpus) > 1:
        pin = lambda: os.sched_setaffinity(0, {cpus[-1]})  # noqa: E731
        os.sched_setaffinity(0, set(cpus[:-1]))
    server_args = ["--serve", str(port), "--loop", args.loop, "--server", args.server]
    server = subprocess.Popen(
        [sys.executable, __file__, *server_args],
        stdout=subprocess.PIPE,
        preexec_fn=pin,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "ready"
        run(measure(port, psutil.Process(server.pid), args))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
