"""A federating bus through many rounds of remote queues coming and going, its link cut
and restored every few rounds: what the bus's process keeps (memory, asyncio tasks,
file descriptors) levels off, and every round delivers everything it pushed. The
gateway's RSS is printed beside it (its own soak test is tests/gateway/test_soak.py)."""

from __future__ import annotations

import asyncio

import psutil
import pytest

from busmq import Bus, Mode
from busmq.federation import LinkState
from tests.federation.conftest import DatacenterA, MakeB
from tests.support.heavy import cpu_heavy
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

QUEUES, MESSAGES, ROUNDS, CUT_EVERY = 100, 5, 20, 4


async def one_round(bus: Bus, target: str, names: list[str]) -> None:
    """Federate every queue, push to it, consume and ack what was pushed, let go."""

    async def one(name: str) -> None:
        async with bus.federate(bus.queue(name), target) as remote:
            await remote.push_batch([f"{name} {i}" for i in range(MESSAGES)])
            got = []
            async with remote.consume(Mode.AT_LEAST_ONCE, max=MESSAGES) as consumer:
                async for delivery in consumer:
                    got.append(delivery.data)
                    await delivery.ack()
            assert got == [f"{name} {i}" for i in range(MESSAGES)]

    await asyncio.wait_for(asyncio.gather(*(one(n) for n in names)), 120)


@cpu_heavy
@pytest.mark.timeout(600)
async def test_a_federating_bus_levels_off_through_rounds_and_link_cuts(
    dc_a: DatacenterA, make_b: MakeB
) -> None:
    bus = await make_b()
    names = [f"fed-soak-{i}" for i in range(QUEUES)]
    process = psutil.Process()
    assert dc_a.gateway.process is not None
    gateway = psutil.Process(dc_a.gateway.process.pid)
    rows: list[tuple[float, int, int, float]] = []  # RSS MiB, tasks, fds; gateway RSS MiB
    async with bus.federate(bus.queue("fed-soak-anchor"), dc_a.url) as anchor:
        for number in range(1, ROUNDS + 1):
            if number % CUT_EVERY == 0:
                await dc_a.proxy.cut()
                await eventually(lambda: anchor.link.state is not LinkState.READY,
                                 what="the link sees the cut")  # fmt: skip
                await dc_a.proxy.restore()
                assert await anchor.link.wait_usable(10)
            await one_round(bus, dc_a.url, names)
            rss, tasks, fds = process.memory_info().rss, len(asyncio.all_tasks()), process.num_fds()
            rows.append((rss / 2**20, tasks, fds, gateway.memory_info().rss / 2**20))
    table = "\n".join(
        f"{i:>5} {rss:>8.1f} {tasks:>6} {fds:>5} {gateway_rss:>12.1f}"
        for i, (rss, tasks, fds, gateway_rss) in enumerate(rows, 1)
    )
    print(f"\nround  RSS MiB  tasks   fds  gateway MiB\n{table}")
    (rss_5, tasks_5, fds_5, _), (rss_20, tasks_20, fds_20, _) = rows[4], rows[19]
    assert rss_20 - rss_5 < 10, f"RSS grew {rss_20 - rss_5:+.1f} MiB from round 5 to 20"
    assert tasks_20 <= tasks_5 + 2, f"asyncio tasks grew from {tasks_5} to {tasks_20}"
    assert fds_20 <= fds_5 + 2, f"file descriptors grew from {fds_5} to {fds_20}"
