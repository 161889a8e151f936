"""busmq on Redis's HA engines: the core benchmark's flood and fixed-rate runs on one
standalone Redis and on a Sentinel-managed shard (a master, one replica, one Sentinel),
with ``async`` and ``replicas=1`` durability, side by side in one run.

Each configuration starts its own servers on free loopback ports and kills them at the
end. Ratios are against the standalone run of the same scenario.

Usage::

    .venv/bin/python bench/ha_bench.py                # 10 s per run
    .venv/bin/python bench/ha_bench.py --seconds 5 --queues 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace

from _redis import RedisTarget, local_redis, local_sentinel_shard  # bench/ is sys.path[0]
from core_bench import Config, Result, run_busmq

SCENARIOS = ("amo", "rate")
SETUPS = (
    ("standalone", "async"),
    ("sentinel", "async"),
    ("sentinel", "replicas=1"),
)


@contextlib.contextmanager
def deployment(kind: str) -> Iterator[RedisTarget]:
    if kind == "standalone":
        with local_redis() as server:
            yield server
    else:
        with local_sentinel_shard(replicas=1, sentinels=1) as shard:
            yield shard


async def main_async(args: argparse.Namespace) -> None:
    base = Config(
        seconds=args.seconds,
        warmup=args.warmup,
        queues=args.queues,
        size=32,
        rate=args.rate,
        batch=100,
        prefetch=100,
        window=1000,
        ack_every=100,
        amo_baseline="list",
        drain_timeout=30.0,
        max_connections=0,
        bus_settings=(),
    )
    results: dict[tuple[str, str, str], Result] = {}
    for kind, durability in SETUPS:
        config = replace(base, durability=durability)
        with deployment(kind) as target:
            for scenario in SCENARIOS:
                print(f"running {kind} {durability} {scenario} ...", file=sys.stderr, flush=True)
                results[(kind, durability, scenario)] = await run_busmq(config, target, scenario)
    print(report(results))


def report(results: dict[tuple[str, str, str], Result]) -> str:
    lines = [
        f"{'deployment':<12} {'durability':<11} {'flood consumed/s':>17} {'vs standalone':>14}"
        f" {'rate p50 ms':>12} {'rate p99 ms':>12}",
    ]
    flood0 = results[("standalone", "async", "amo")].consumed_per_s
    for kind, durability in SETUPS:
        flood = results[(kind, durability, "amo")]
        rate = results[(kind, durability, "rate")]
        lines.append(
            f"{kind:<12} {durability:<11} {flood.consumed_per_s:>17,.0f}"
            f" {flood.consumed_per_s / flood0:>13.2f}x {rate.p50_ms:>12.3f} {rate.p99_ms:>12.3f}"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--queues", type=int, default=100)
    p.add_argument("--rate", type=float, default=5000.0, help="total msg/s of the rate run")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main_async(parse_args(None)))
