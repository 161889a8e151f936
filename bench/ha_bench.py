"""busmq on Redis's HA and scale-out engines, side by side in one run: the core
benchmark's flood (at-most-once) and 5,000 msg/s fixed-rate runs on

- one standalone Redis;
- a Sentinel-managed shard (a master, one replica, one Sentinel), with ``async`` and
  with ``replicas=1`` durability;
- a 3-master Redis Cluster, from one client process and from two (each with half the
  queues and half the rate; their figures are added up, the p99 is the worse one).

Each configuration starts its own servers on free loopback ports and kills them at the
end. Ratios are against the standalone run of the same scenario.

Usage::

    .venv/bin/python bench/ha_bench.py                # 10 s per run
    .venv/bin/python bench/ha_bench.py --seconds 5 --queues 50
    .venv/bin/python bench/ha_bench.py --rounds 3      # medians of 3 interleaved rounds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from _redis import (  # bench/ is sys.path[0]
    LocalCluster,
    RedisTarget,
    local_cluster,
    local_redis,
    local_sentinel_shard,
    process_cpu_seconds,
)
from core_bench import Config, Result, run_busmq

SCENARIOS = ("amo", "rate")
SETUPS = (  # deployment, durability, client processes
    ("standalone", "async", 1),
    ("sentinel", "async", 1),
    ("sentinel", "replicas=1", 1),
    ("cluster", "async", 1),
    ("cluster", "async", 2),
)


@dataclass
class UrlTarget:
    """A deployment another process started: its Redis processes are ``pids``."""

    url: str
    pids: list[int]

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(pid) for pid in self.pids)


@contextlib.contextmanager
def deployment(kind: str) -> Iterator[RedisTarget]:
    if kind == "standalone":
        with local_redis() as server:
            yield server
    elif kind == "sentinel":
        with local_sentinel_shard(replicas=1, sentinels=1) as shard:
            yield shard
    else:
        with local_cluster(masters=3) as cluster:
            yield cluster


async def in_processes(
    config: Config, target: LocalCluster, scenario: str, processes: int
) -> Result:
    """Run ``scenario`` from ``processes`` processes, each on its share of the queues."""
    share = replace(config, queues=config.queues // processes, rate=config.rate / processes)
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__)),
            "--worker",
            json.dumps({**asdict(share), "name_prefix": f"p{i}", "bus_settings": []}),
            json.dumps({"url": target.url, "pids": target.pids}),
            scenario,
            stdout=asyncio.subprocess.PIPE,
        )
        for i in range(processes)
    ]
    outputs = await asyncio.gather(*(w.communicate() for w in workers))
    parts = [Result(**json.loads(out)) for out, _ in outputs]
    total = Result("busmq", scenario)
    total.consumed_per_s = sum(p.consumed_per_s for p in parts)
    total.client_cpu = sum(p.client_cpu for p in parts)
    # Each worker measured the whole cluster's CPU over its own (nearly equal) window.
    total.redis_cpu = sum(p.redis_cpu for p in parts) / len(parts)
    total.p50_ms = max(p.p50_ms for p in parts)
    total.p99_ms = max(p.p99_ms for p in parts)
    return total


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
    results: dict[tuple[str, str, int, str], list[Result]] = defaultdict(list)
    # Rounds interleave the setups, so a slow spell of a shared machine touches them all.
    for round_number in range(1, args.rounds + 1):
        for kind, durability, processes in SETUPS:
            config = replace(base, durability=durability)
            with deployment(kind) as target:
                for scenario in SCENARIOS:
                    print(
                        f"round {round_number}: {kind} {durability} x{processes} {scenario} ...",
                        file=sys.stderr,
                    )
                    if processes == 1:
                        result = await run_busmq(config, target, scenario)
                    else:
                        assert isinstance(target, LocalCluster)
                        result = await in_processes(config, target, scenario, processes)
                    results[(kind, durability, processes, scenario)].append(result)
    print(report(results))


def report(results: dict[tuple[str, str, int, str], list[Result]]) -> str:
    """Medians over the rounds; the flood's lowest-highest is in brackets."""
    lines = [
        f"{'deployment':<12} {'durability':<11} {'procs':>5} {'flood consumed/s':>17}"
        f" {'(min-max)':>17} {'vs standalone':>14} {'client cores':>12} {'redis cores':>12}"
        f" {'rate p50 ms':>12} {'rate p99 ms':>12}",
    ]

    def median(key: tuple[str, str, int, str], field: str) -> float:
        return statistics.median(getattr(r, field) for r in results[key])

    flood0 = median(("standalone", "async", 1, "amo"), "consumed_per_s")
    for kind, durability, processes in SETUPS:
        amo, rate = (kind, durability, processes, "amo"), (kind, durability, processes, "rate")
        flood = median(amo, "consumed_per_s")
        floods = [r.consumed_per_s for r in results[amo]]
        spread = f"({min(floods) / 1000:,.0f}k-{max(floods) / 1000:,.0f}k)"
        lines.append(
            f"{kind:<12} {durability:<11} {processes:>5} {flood:>17,.0f} {spread:>17}"
            f" {flood / flood0:>13.2f}x {median(amo, 'client_cpu'):>12.2f}"
            f" {median(amo, 'redis_cpu'):>12.2f} {median(rate, 'p50_ms'):>12.3f}"
            f" {median(rate, 'p99_ms'):>12.3f}"
        )
    return "\n".join(lines)


def run_worker(config_json: str, target_json: str, scenario: str) -> None:
    fields = json.loads(config_json)
    fields["bus_settings"] = tuple(map(tuple, fields["bus_settings"]))
    target = UrlTarget(**json.loads(target_json))
    result = asyncio.run(run_busmq(Config(**fields), target, scenario))
    print(json.dumps(asdict(result)))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--queues", type=int, default=100)
    p.add_argument("--rate", type=float, default=5000.0, help="total msg/s of the rate run")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (medians reported)")
    p.add_argument(
        "--worker", nargs=3, metavar=("CONFIG", "TARGET", "SCENARIO"), help=argparse.SUPPRESS
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args(None)
    if arguments.worker:
        run_worker(*arguments.worker)
    else:
        asyncio.run(main_async(arguments))
