"""busmq gateway soak: rounds of streams coming and going, and what the gateway keeps.

Each round, through one gateway (its own process, ``--workers N``) from one client
process over ``--connections`` HTTP/2 connections: ``AttachQueue`` for ``--queues``
queues (the same names every round), a ``Consume`` stream on each, ``PushMany`` of
``--messages`` to each queue, every stream reads its messages and is cancelled; each
round on new connections (``--no-reconnect``: the same ones all along). After
each round it prints the gateway's RSS (all its processes), open file descriptors and
threads, Redis's connected clients, and the consumer-group consumers left in Redis.

The script starts its own ``redis-server`` (free loopback port) and its own gateway:

    .venv/bin/python bench/soak_bench.py                    # 20 rounds of 1,000 queues
    .venv/bin/python bench/soak_bench.py --rounds 30 --workers 2
    .venv/bin/python bench/soak_bench.py --json soak.json   # the rows, for a test or a diff
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import psutil
import redis.asyncio as aioredis
from google.protobuf import duration_pb2

from _redis import local_redis  # bench/ is sys.path[0]
from busmq.keys import CONSUMER_GROUP, QueueKeys
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2
from gateway_bench import AUTH, start_gateway


@dataclass
class Round:
    round: int
    rss_mib: float
    fds: int
    threads: int
    redis_clients: int
    group_consumers: int
    seconds: float


def gateway_processes(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


async def one_round(
    stubs: list[queue_service_pb2_grpc.QueueServiceStub], names: list[str], messages: int
) -> None:
    ttl = duration_pb2.Duration(seconds=600)
    await asyncio.gather(
        *(
            stubs[i % len(stubs)].AttachQueue(
                pb.AttachQueueRequest(queue=n, ttl=ttl), metadata=AUTH
            )
            for i, n in enumerate(names)
        )
    )
    calls = [
        stubs[i % len(stubs)].Consume(pb.ConsumeRequest(queue=n), metadata=AUTH)
        for i, n in enumerate(names)
    ]

    async def read(call: grpc.aio.UnaryStreamCall) -> None:  # type: ignore[type-arg]
        got = 0
        async for response in call:
            if response.HasField("delivery"):
                got += 1
                if got == messages:
                    break
        call.cancel()

    readers = [asyncio.create_task(read(c)) for c in calls]
    payload = [types_pb2.OutgoingMessage(payload=b"x" * 32)] * messages
    pushes = [pb.PushRequest(queue=n, messages=payload) for n in names]
    for start in range(0, len(pushes), 250):
        request = pb.PushManyRequest(pushes=pushes[start : start + 250])
        await stubs[start // 250 % len(stubs)].PushMany(request, metadata=AUTH)
    await asyncio.wait_for(asyncio.gather(*readers), 300)


async def redis_figures(client: aioredis.Redis, names: list[str]) -> tuple[int, int]:
    clients = len(await client.client_list())
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.xinfo_groups(QueueKeys(name).stream)
    consumers = 0
    for groups in await pipe.execute(raise_on_error=False):
        if isinstance(groups, list):
            consumers += sum(
                int(g["consumers"]) for g in groups if g["name"] == CONSUMER_GROUP.encode()
            )
    return clients, consumers


async def soak(args: argparse.Namespace) -> list[Round]:
    rows: list[Round] = []
    names = [f"soak-{i}" for i in range(args.queues)]
    with local_redis() as redis:
        gateway, target = await start_gateway(redis.url, args.workers)
        admin = aioredis.Redis.from_url(redis.url)
        options = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel

        def connect() -> list[grpc.aio.Channel]:
            return [
                grpc.aio.insecure_channel(target, options=options) for _ in range(args.connections)
            ]

        channels = connect()
        loop = asyncio.get_running_loop()
        try:
            print(f"{'round':>5}{'RSS MiB':>9}{'fds':>6}{'threads':>8}{'redis clients':>14}"
                  f"{'group consumers':>16}{'s':>6}")  # fmt: skip
            for number in range(1, args.rounds + 1):
                started = loop.time()
                if args.reconnect and number > 1:  # clients reconnect: new connections
                    for channel in channels:
                        await channel.close()
                    channels = connect()
                stubs = [queue_service_pb2_grpc.QueueServiceStub(c) for c in channels]
                await one_round(stubs, names, args.messages)
                seconds = loop.time() - started
                await asyncio.sleep(args.settle)  # the gateway sees the cancels
                processes = gateway_processes(gateway.pid)
                rss = sum(p.memory_info().rss for p in processes) / 2**20
                fds = sum(p.num_fds() for p in processes)
                threads = sum(p.num_threads() for p in processes)
                clients, consumers = await redis_figures(admin, names)
                row = Round(number, rss, fds, threads, clients, consumers, seconds)
                rows.append(row)
                print(f"{number:>5}{rss:>9.1f}{fds:>6}{threads:>8}{clients:>14}{consumers:>16}"
                      f"{seconds:>6.1f}", flush=True)  # fmt: skip
        finally:
            for channel in channels:
                await channel.close()
            await admin.aclose()
            gateway.send_signal(signal.SIGTERM)
            await gateway.wait()
    if len(rows) >= 20:
        grew = rows[19].rss_mib - rows[4].rss_mib
        print(f"\nRSS from round 5 to round 20: {grew:+.1f} MiB")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=10, help="per queue and round")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument(
        "--reconnect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="new connections every round, as reconnecting clients make (default)",
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after each round")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = asyncio.run(soak(args))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    sys.exit(main())
