"""Clients benchmark: the gateway workload (at-most-once flood, then single pushes at a fixed
rate) from the Python client (a federated queue) and from the TypeScript client, against
one gateway process, in one run.

The script starts its own ``redis-server`` processes and gateway on free loopback ports,
builds the TypeScript client (``npm run build``) and runs ``clients/typescript/dist/bench/
flood.js`` with the same options.

    .venv/bin/python bench/clients_bench.py               # 10 s per run
    .venv/bin/python bench/clients_bench.py --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import tempfile
from pathlib import Path

from _flow import Figures  # bench/ is sys.path[0]
from _redis import local_redis
from busmq import Bus, BusSettings
from busmq.federation import FederationSettings, FederationTarget
from federation_bench import (
    SECRET,
    AnyQueue,
    fixed_rate,
    flood,
    report,
    start_gateway,
    workload_arguments,
)

TYPESCRIPT = Path(__file__).resolve().parents[1] / "clients" / "typescript"


async def typescript(url: str, scenario: str, args: argparse.Namespace) -> Figures:
    options = {
        "url": url,
        "secret": SECRET,
        "scenario": scenario,
        "queues": args.queues,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "batch": args.batch,
        "window": args.window,
        "size": args.size,
        "prefetch": args.prefetch,
        "rate": args.rate,
        "tag": f"ts-{scenario}",
    }
    process = await asyncio.create_subprocess_exec(
        "node", str(TYPESCRIPT / "dist" / "bench" / "flood.js"), json.dumps(options),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the TypeScript bench failed ({process.returncode})")
    figures = json.loads(out.decode().strip().splitlines()[-1])
    label = "typescript flood" if scenario == "flood" else f"typescript {args.rate:,.0f} msg/s"
    if figures.get("failed"):
        print(f"{label}: {figures['failed']:,} pushes failed (the gateway was saturated)")
    return Figures(
        label,
        figures["seconds"],
        pushed=figures["pushed"],
        consumed=figures["consumed"],
        p50_ms=figures["p50_ms"],
        p99_ms=figures["p99_ms"],
    )


async def main(args: argparse.Namespace) -> None:
    build = await asyncio.create_subprocess_exec("npm", "run", "--silent", "build", cwd=TYPESCRIPT)
    if await build.wait() != 0:
        raise RuntimeError("npm run build failed in clients/typescript")
    with local_redis() as redis_a, local_redis() as redis_b, tempfile.TemporaryDirectory() as tmp:
        gateway, port = await start_gateway(redis_a.url)
        url = f"http://127.0.0.1:{port}"
        bus_b = Bus(BusSettings(redis_urls=(redis_b.url,)))
        try:
            await bus_b.connect()
            target = FederationTarget(url, secret=SECRET)
            bus_b.configure_federation(
                FederationSettings(targets=[target], outbox_path=Path(tmp) / "outbox.sqlite3")
            )

            def remote(name: str) -> AnyQueue:
                return bus_b.federate(name, url)

            rows = [
                await flood(remote, "python (federated) flood", args),
                await typescript(url, "flood", args),
                await fixed_rate(
                    remote, f"python (federated) {args.rate:,.0f} msg/s", args, args.rate
                ),
                await typescript(url, "rate", args),
            ]
        finally:
            await bus_b.close()
            gateway.send_signal(signal.SIGTERM)
            await gateway.wait()
    report(rows)
    python_flood, ts_flood, python_rate, ts_rate = rows
    ratio = ts_flood.consumed_per_s / python_flood.consumed_per_s
    print(f"\ntypescript / python flood (consumed/s): {ratio:.2f}")
    print(
        f"p99 at {args.rate:,.0f} msg/s: python {python_rate.p99_ms:.2f} ms, "
        f"typescript {ts_rate.p99_ms:.2f} ms"
    )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_arguments(parser, seconds=10.0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
