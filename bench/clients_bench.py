"""Clients benchmark: the gateway workload (at-most-once flood, then single pushes at a fixed
rate) from the Python client (a federated queue), the TypeScript client and the Go client,
against one gateway process, in one run.

The script starts its own ``redis-server`` processes and gateway on free loopback ports,
builds the TypeScript client (``npm run build``) and the Go bench program (GOPATH mode,
Debian's packages), and runs ``clients/typescript/dist/bench/flood.js`` and
``clients/go/cmd/flood`` with the same options.

    .venv/bin/python bench/clients_bench.py               # 10 s per run
    .venv/bin/python bench/clients_bench.py --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
from pathlib import Path

from _flow import Figures, report  # bench/ is sys.path[0]
from _redis import local_redis
from busmq import Bus, BusSettings
from busmq.federation import FederationSettings, FederationTarget
from federation_bench import (
    SECRET,
    AnyQueue,
    fixed_rate,
    flood,
    start_gateway,
    workload_arguments,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' build helpers
from tests.support.client_programs import build_go, build_typescript


async def run_client(
    name: str, argv: list[str], url: str, scenario: str, args: argparse.Namespace
) -> Figures:
    """Run one client's bench program (``argv`` + JSON options); its figures."""
    options = {
        "url": url,
        "address": url.removeprefix("http://"),
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
        "tag": f"{name}-{scenario}",
    }
    process = await asyncio.create_subprocess_exec(
        *argv, json.dumps(options), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the {name} bench failed ({process.returncode})")
    figures = json.loads(out.decode().strip().splitlines()[-1])
    label = f"{name} flood" if scenario == "flood" else f"{name} {args.rate:,.0f} msg/s"
    if figures.get("failed"):
        print(f"{label}: {figures['failed']:,.0f} pushes failed (the gateway was saturated)")
    return Figures(
        label,
        figures["seconds"],
        pushed=int(figures["pushed"]),
        consumed=int(figures["consumed"]),
        p50_ms=figures["p50_ms"],
        p99_ms=figures["p99_ms"],
    )


async def build_clients(directory: Path) -> dict[str, list[str]]:
    """Build the TypeScript and Go bench programs; the command line of each."""
    dist = await build_typescript()
    binary = await build_go("flood", directory)
    return {"typescript": ["node", str(dist / "bench" / "flood.js")], "go": [str(binary)]}


async def main(args: argparse.Namespace) -> None:
    with local_redis() as redis_a, local_redis() as redis_b, tempfile.TemporaryDirectory() as tmp:
        clients = await build_clients(Path(tmp))
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

            floods = [await flood(remote, "python (federated) flood", args)]
            label = f"python {args.rate:,.0f} msg/s"
            rates = [await fixed_rate(remote, label, args, args.rate, "python")]
            for name, argv in clients.items():
                floods.append(await run_client(name, argv, url, "flood", args))
                rates.append(await run_client(name, argv, url, "rate", args))
        finally:
            await bus_b.close()
            gateway.send_signal(signal.SIGTERM)
            await gateway.wait()
    report(floods + rates)
    python_flood = floods[0]
    print()
    for row in floods[1:]:
        ratio = row.consumed_per_s / python_flood.consumed_per_s
        print(f"{row.label} / python flood (consumed/s): {ratio:.2f}")
    for row in rates:
        print(f"p99 of {row.label}: {row.p99_ms:.2f} ms")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_arguments(parser, seconds=10.0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
