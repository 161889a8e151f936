"""Redis's own time per message of a read and of an ack, plain against ordered.

Where the flood is bound by Redis (an ordered queue's is), what counts is the time each
script spends inside Redis. This bench calls the scripts the consumers call, as they call
them, and reads that time from ``INFO commandstats`` around each call (execution time
only: no network, no client), so its figures move only when the scripts do:

- **plain**: ``push.lua``, the lean ``XREADGROUP`` an unordered at-least-once consumer
  reads with, then ``ack.lua``;
- **ordered**: ``push.lua``, ``read.lua`` on a queue ordered per header ``customer``, then
  ``ack.lua``.

``--messages`` (30,000) are pushed first, each with one of ``--keys`` (10,000) keys at
random. ``--consumers`` (1) read ``--batch`` (100) each in turn; then their batches are
acked in a shuffled order (several consumers ack out of read order, which decides how
much of an ack a trim can take; see docs/design.md, "Consumption modes"). Figures are
medians over batches, then over ``--rounds`` (3) rounds, interleaved.

Usage::

    .venv/bin/python bench/script_costs.py
    .venv/bin/python bench/script_costs.py --consumers 4
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from _redis import local_redis  # bench/ is sys.path[0]
from busmq import Bus, BusSettings


async def _usec(raw: aioredis.Redis, command: str) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("usec", 0))


def _script_entries(entries: list[Any]) -> list[Any]:
    """read.lua's entries as (id, fields), from its flat list (id, number of fields,
    fields, ...), or from the pairs an older tree's returns (for A/B runs against it)."""
    if not entries or isinstance(entries[0], list):
        return entries
    pairs, at = [], 0
    while at < len(entries):
        pairs.append((entries[at], entries[at + 2 : at + 2 + entries[at + 1]]))
        at += 2 + entries[at + 1]
    return pairs


async def _read(
    raw: aioredis.Redis, bus: Bus, store: Any, consumer: str, ordered: bool, count: int
) -> tuple[list[int], float]:
    """One consumer's read: the ids it got and Redis's time for it in microseconds."""
    keys = store.keys
    if ordered:
        sha, _ = bus.scripts.source("read")
        every = keys.with_dead_letters()
        before = await _usec(raw, "evalsha")
        entries, retried, *_ = await raw.evalsha(
            sha, len(every), *every, consumer, count, "0", store.name
        )
        spent = await _usec(raw, "evalsha") - before
        entries = [*_script_entries(entries), *retried]
    else:
        before = await _usec(raw, "xreadgroup")
        reply = await raw.xreadgroup("busmq", consumer, {keys.stream: ">"}, count=count)
        spent = await _usec(raw, "xreadgroup") - before
        entries = reply[0][1] if reply else []
    return [int(entry[0].split(b"-")[0]) for entry in entries], float(spent)


async def measure(
    raw: aioredis.Redis, bus: Bus, args: argparse.Namespace, ordered: bool, tag: str
) -> tuple[float, float, float]:
    """Median microseconds per message of a push, a read and an ack."""
    queue = bus.queue(f"costs-{int(ordered)}-{tag}")
    await queue.attach()
    if ordered:
        await queue.set_ordering("customer")
    rng = random.Random(39)
    pushes: list[float] = []
    for _ in range(0, args.messages, args.batch):
        batch = [
            (b"x" * 32, {"customer": str(rng.randrange(args.keys))}) for _ in range(args.batch)
        ]
        before = await _usec(raw, "evalsha")
        await queue.push_batch(batch)
        pushes.append((await _usec(raw, "evalsha") - before) / len(batch))
    store = queue.store
    ack_sha, _ = bus.scripts.source("ack")
    reads: list[float] = []
    acks: list[float] = []
    done = 0
    while done < args.messages:
        batches = []
        for c in range(args.consumers):
            ids, spent = await _read(raw, bus, store, f"c{c}", ordered, args.batch)
            if ids:
                reads.append(spent / len(ids))
                batches.append(ids)
        if not batches:
            break
        rng.shuffle(batches)
        for ids in batches:
            before = await _usec(raw, "evalsha")
            await raw.evalsha(ack_sha, len(store.keys.ack_keys), *store.keys.ack_keys, *ids)
            acks.append((await _usec(raw, "evalsha") - before) / len(ids))
            done += len(ids)
    await queue.close()
    return statistics.median(pushes), statistics.median(reads), statistics.median(acks)


async def run(url: str, args: argparse.Namespace) -> str:
    raw = aioredis.from_url(url)
    runs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    try:
        async with Bus(BusSettings(redis_urls=(url,))) as bus:
            for name in ("push", "read", "ack"):  # loaded before the first call is timed
                await raw.script_load(bus.scripts.source(name)[1])
            for round_ in range(args.rounds):
                for ordered in (False, True):
                    runs[ordered].append(await measure(raw, bus, args, ordered, str(round_)))
    finally:
        await raw.aclose()
    lines = [
        f"Redis time per message (us), {args.consumers} consumer(s) of {args.batch}, "
        f"{args.keys:,} keys, medians of {args.rounds} rounds"
    ]
    for ordered in (False, True):
        push, read, ack = (statistics.median(run[i] for run in runs[ordered]) for i in range(3))
        rounds = " ".join("/".join(f"{x:.2f}" for x in run) for run in runs[ordered])
        name = "ordered" if ordered else "plain"
        lines.append(
            f"  {name:<8} push {push:6.2f}  read {read:6.2f}  ack {ack:6.2f}  "
            f"total {push + read + ack:6.2f}   (rounds, push/read/ack: {rounds})"
        )
    return "\n".join(lines)


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=30_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=100, help="read and ack batch size")
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


async def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(argv)
    with local_redis() as server:
        print(await run(server.url, args))


if __name__ == "__main__":
    asyncio.run(main())
