"""busmq federation soak: a federating bus through rounds of remote queues coming and
going, its link cut (the gateway SIGKILLed and started again) every few rounds.

Each round the bus (in this process, on its own ``redis-server``) federates ``--queues``
queues of a gateway (its own process, on another ``redis-server``), pushes
``--messages`` to each, consumes and acks them, and lets go. Every ``--cut-every``
rounds the gateway is killed and restarted on the same port, and the round runs on the
resumed link. After each round it prints this process's RSS, asyncio tasks and open
file descriptors (the federating bus), and the gateway's RSS:

    .venv/bin/python bench/federated_soak_bench.py            # 20 rounds of 200 queues
    .venv/bin/python bench/federated_soak_bench.py --rounds 40 --cut-every 5
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from pathlib import Path

import psutil

from _redis import free_port, local_redis  # bench/ is sys.path[0]
from busmq import Bus, BusSettings, Mode
from busmq.federation import FederationSettings, FederationTarget
from gateway_bench import SECRET, start_gateway


async def one_round(bus: Bus, target: str, names: list[str], messages: int) -> None:
    async def one(name: str) -> None:
        async with bus.federate(bus.queue(name), target) as remote:
            await remote.push_batch([b"x" * 32] * messages)
            async with remote.consume(Mode.AT_LEAST_ONCE, max=messages) as consumer:
                async for delivery in consumer:
                    await delivery.ack()

    await asyncio.gather(*(one(n) for n in names))


async def soak(args: argparse.Namespace) -> None:
    names = [f"fed-soak-{i}" for i in range(args.queues)]
    port = free_port()
    target = f"http://127.0.0.1:{port}"
    with local_redis() as redis_a, local_redis() as redis_b, tempfile.TemporaryDirectory() as tmp:
        gateway, _ = await start_gateway(redis_a.url, port=port)
        bus = Bus(BusSettings(redis_urls=(redis_b.url,)))
        await bus.connect()
        bus.configure_federation(
            FederationSettings(
                targets=[FederationTarget(target, secret=SECRET)],
                outbox_path=Path(tmp) / "outbox.sqlite3",
                reconnect_backoff_max=0.5,
            )
        )
        me = psutil.Process()
        loop = asyncio.get_running_loop()
        print(f"{'round':>5}{'RSS MiB':>9}{'tasks':>7}{'fds':>6}{'gateway MiB':>13}{'s':>6}")
        try:
            for number in range(1, args.rounds + 1):
                if number % args.cut_every == 0:
                    gateway.send_signal(signal.SIGKILL)
                    await gateway.wait()
                    gateway, _ = await start_gateway(redis_a.url, port=port)
                started = loop.time()
                await one_round(bus, target, names, args.messages)
                seconds = loop.time() - started
                rss = me.memory_info().rss / 2**20
                gateway_rss = psutil.Process(gateway.pid).memory_info().rss / 2**20
                print(f"{number:>5}{rss:>9.1f}{len(asyncio.all_tasks()):>7}{me.num_fds():>6}"
                      f"{gateway_rss:>13.1f}{seconds:>6.1f}", flush=True)  # fmt: skip
        finally:
            await bus.close()
            gateway.send_signal(signal.SIGTERM)
            await gateway.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--queues", type=int, default=200)
    parser.add_argument("--messages", type=int, default=10, help="per queue and round")
    parser.add_argument("--cut-every", type=int, default=4, help="rounds between link cuts")
    asyncio.run(soak(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
