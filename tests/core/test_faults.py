"""Fault and process tests: crashed consumers, lapsed leases, a Redis killed and
restarted mid-stream, shards added under existing queues, and the embedded Redis.

Every test runs real ``redis-server`` processes (and, where a client must crash, real
client processes, see ``tests/support/bus_worker.py``) and waits for conditions with
``eventually`` rather than for guessed times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions

from busmq import (
    Bus,
    BusTimeoutError,
    BusUnavailableError,
    Event,
    Mode,
)
from busmq.consumer import Consumer
from busmq.keys import CONSUMER_GROUP, QueueKeys
from busmq.shard import Shard, ShardState, shard_identity
from busmq.sharding import rank
from tests.conftest import FAST, fast_settings
from tests.support.loops import END, Ledger, consume, produce
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

WORKER = Path(__file__).resolve().parents[1] / "support" / "bus_worker.py"
MakeBus = Callable[..., Awaitable[Bus]]


# -- helpers -----------------------------------------------------------------------------


async def holds_for(
    check: Callable[[], Awaitable[bool]], duration: float, *, interval: float = 0.05, what: str
) -> None:
    """Assert ``check`` is true at every poll for ``duration`` seconds (the opposite of
    ``eventually``: for behaviour that must *not* happen, such as an expiry)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration
    while loop.time() < deadline:
        assert await check(), f"{what} stopped holding"
        await asyncio.sleep(interval)  # the poll interval of the observation window


async def spawn_worker(
    *args: str, stderr: Path, stdout: int = asyncio.subprocess.DEVNULL
) -> asyncio.subprocess.Process:
    with stderr.open("ab") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=stdout,
            stderr=err,
        )


@contextlib.asynccontextmanager
async def reaped(
    processes: list[asyncio.subprocess.Process],
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """SIGKILL (by pid) and reap whichever of our worker processes are still running."""
    try:
        yield processes
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.wait()


def worker_settings(**overrides: Any) -> str:
    return json.dumps({**FAST, **overrides})


async def key_count(server: RedisServer, name: str) -> int:
    client = server.client()
    try:
        return int(await client.exists(*QueueKeys(name).all()))
    finally:
        await client.aclose()


def complete_lines(path: Path) -> list[list[str]]:
    """A worker's log (if it wrote one) as lines of words, up to a line a SIGKILL tore."""
    lines = []
    if path.exists():
        for line in path.read_text().splitlines(keepends=True):
            if not line.endswith("\n"):  # torn by a SIGKILL
                break
            lines.append(line.split())
    return lines


@dataclass
class WorkerLog:
    """What a ``bus_worker.py consume`` process reported (complete lines only)."""

    consumer: str = ""
    delivered: list[tuple[int, int]] = field(default_factory=list)
    delivered_at: list[float] = field(default_factory=list)  # Unix time of each delivery
    acked: list[tuple[int, int]] = field(default_factory=list)
    unknown: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> WorkerLog:
        log = cls()
        for kind, *rest in complete_lines(path):
            if kind == "C":
                log.consumer = rest[0]
                continue
            entry = (int(rest[0]), int(rest[1]))
            {"D": log.delivered, "A": log.acked, "U": log.unknown}[kind].append(entry)
            if kind == "D":
                log.delivered_at.append(float(rest[2]))
        return log


def stream_id(raw: bytes | str) -> int:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return int(text.split("-")[0])


def batched(items: Iterable[int], size: int) -> Iterable[list[int]]:
    chunk: list[int] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# -- 1. at-least-once across processes, one of them killed -----------------------------------


async def test_at_least_once_across_processes_survives_a_killed_consumer(
    redis_server: RedisServer, make_bus: MakeBus, tmp_path: Path
) -> None:
    total = 3000
    bus = await make_bus([redis_server.url])
    queue = bus.queue("jobs")
    await queue.attach()
    pushed: list[int] = []
    for chunk in batched(range(total), 500):
        pushed += await queue.push_batch([{"n": n} for n in chunk])
    assert pushed == list(range(1, total + 1))

    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    options = ["--settings", worker_settings(), "--visibility", "1.0"]
    options += ["--prefetch", "20", "--delay", "0.002"]  # deliveries in flight when killed
    async with reaped([]) as workers:
        for i, log in enumerate(logs):
            args = ["consume", redis_server.url, queue.name, str(log), *options]
            workers.append(await spawn_worker(*args, stderr=tmp_path / f"worker{i}.err"))
        victim, survivors = workers[0], workers[1:]

        def victim_busy() -> bool:
            for i, worker in enumerate(workers):
                err = (tmp_path / f"worker{i}.err").read_text()
                assert worker.returncode is None, f"worker {i} exited: {err}"
            reports = [WorkerLog.read(log) for log in logs]
            return all(r.consumer for r in reports) and len(reports[0].acked) >= 150

        await eventually(victim_busy, timeout=20, what="all workers consuming")
        victim.kill()  # SIGKILL, mid-delivery: it has deliveries fetched but not acked
        await victim.wait()
        victim_log = WorkerLog.read(logs[0])
        client = redis_server.client()
        try:
            in_flight = await client.xpending_range(
                QueueKeys(queue.name).stream,
                CONSUMER_GROUP,
                "-",
                "+",
                total,
                consumername=victim_log.consumer,
            )
        finally:
            await client.aclose()
        orphaned = {stream_id(p["message_id"]) for p in in_flight}
        assert orphaned, "the killed worker had no unacked deliveries"
        assert await queue.count() > len(orphaned), "the queue drained before the kill"

        async def drained() -> bool:
            return await queue.count() == 0

        await eventually(drained, timeout=30, what="queue drained by the survivors")
        for worker in survivors:
            worker.send_signal(signal.SIGTERM)
        for worker in survivors:
            assert await asyncio.wait_for(worker.wait(), 15) == 0

    reports = [WorkerLog.read(log) for log in logs]
    acks = [entry for report in reports for entry in report.acked]
    acked_ids = [message_id for message_id, _ in acks]
    # queue.ack raises UnknownMessageError for ids not pending: one success per id.
    assert len(acked_ids) == len(set(acked_ids)), "a message was acked twice"
    missing = set(pushed) - set(acked_ids)
    # The only id that may be acked without a report is the one the victim was killed
    # between its ack and the report line; then it is really gone from the stream.
    if missing:
        assert missing == {victim_log.delivered[-1][0]}, f"lost messages: {sorted(missing)[:20]}"
    assert set(acked_ids) <= set(pushed)

    count_of = dict(acks)
    assert orphaned <= set(count_of), "a delivery of the killed worker was never acked"
    assert all(count_of[message_id] >= 2 for message_id in orphaned)
    survivor_acks = {m for report in reports[1:] for m, _ in report.acked}
    assert orphaned <= survivor_acks
    assert any(count > 1 for _, count in acks)
    victim_acks = {m for m, _ in reports[0].acked}
    assert victim_acks and not (victim_acks & survivor_acks)


# -- 2. expiry -------------------------------------------------------------------------------


async def test_queue_expires_ttl_after_last_detach(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url])
    queue = bus.queue("ephemeral")
    await queue.attach(ttl=1)
    await queue.push("kept until the ttl runs out")
    await queue.detach()
    loop = asyncio.get_running_loop()
    detached_at = loop.time()
    assert await queue.exists()
    remaining = await queue.ttl()
    assert remaining is not None and 0 < remaining <= 1.0
    assert await key_count(redis_server, queue.name) == 2  # info and stream; no leases

    async def gone() -> bool:
        return not await queue.exists()

    await eventually(gone, timeout=5, what="queue expired")
    assert loop.time() - detached_at >= 0.8
    assert await key_count(redis_server, queue.name) == 0  # stream and leases went too


async def test_attached_queue_outlives_its_ttl_through_lease_renewal(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    lease, ttl = 0.5, 0.5
    bus = await make_bus([redis_server.url], lease_seconds=lease)
    queue = bus.queue("renewed")
    await queue.attach(ttl=ttl)
    await queue.push("still here")

    async def alive() -> bool:
        remaining = await queue.ttl()
        return remaining is not None and remaining <= lease + ttl

    # Without renewal it would be gone after lease + ttl = 1 s; watch it for 3x that.
    await holds_for(alive, 3 * (lease + ttl), what="attached queue alive")
    assert await queue.count() == 1

    await queue.detach()

    async def gone() -> bool:
        return not await queue.exists()

    await eventually(gone, timeout=ttl + 3, what="queue expired after detach")


async def test_crashed_clients_lease_lapses(
    redis_server: RedisServer, make_bus: MakeBus, tmp_path: Path
) -> None:
    lease, ttl = 1.0, 0.5
    bus = await make_bus([redis_server.url])
    queue = bus.queue("orphan")  # not attached here: only the worker holds it
    async with reaped([]) as workers:
        worker = await spawn_worker(
            "attach",
            redis_server.url,
            queue.name,
            "--settings",
            worker_settings(lease_seconds=lease),
            "--ttl",
            str(ttl),
            stdout=asyncio.subprocess.PIPE,
            stderr=tmp_path / "attach.err",
        )
        workers.append(worker)
        assert worker.stdout is not None
        line = await asyncio.wait_for(worker.stdout.readline(), 15)
        assert line == b"attached\n", (tmp_path / "attach.err").read_text()
        assert await queue.exists()

        loop = asyncio.get_running_loop()
        worker.kill()  # SIGKILL: no detach, no more renewals
        killed_at = loop.time()
        await worker.wait()
        assert await queue.exists(), "the queue must outlive its client by the lease"

        async def gone() -> bool:
            return not await queue.exists()

        await eventually(gone, timeout=lease + ttl + 2, what="crashed client's queue expired")
        assert loop.time() - killed_at <= lease + ttl + 0.5
    assert await key_count(redis_server, queue.name) == 0


# -- 3. Redis killed and restarted mid-stream ------------------------------------------------


async def test_redis_killed_and_restarted_mid_stream(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    # An outage longer than failover_timeout: pushes that waited it out give up.
    bus = await make_bus([redis_server.url], operation_timeout=1.0, failover_timeout=1.5)
    transitions: list[str] = []

    def record(event: Event) -> None:
        if event.kind in ("online", "offline"):
            transitions.append(event.kind)

    bus.events.on(record)
    queue = bus.queue("stream")
    await queue.attach()

    pushed: list[int] = []
    failures: list[BaseException] = []
    stop_producing = asyncio.Event()

    async def produce() -> None:
        n = 0
        while not stop_producing.is_set():
            try:
                pushed.append(await queue.push({"n": n}))
            except BusUnavailableError as exc:  # includes BusTimeoutError
                failures.append(exc)
            n += 1
            await asyncio.sleep(0.005)  # a steady trickle, not a flood

    consumed: set[int] = set()
    deliveries = 0
    consumer = queue.consume(Mode.AT_LEAST_ONCE, prefetch=10, visibility_timeout=1.0)

    async def consume() -> None:
        nonlocal deliveries
        async with consumer:
            async for delivery in consumer:
                deliveries += 1
                consumed.add(delivery.id)
                # An ack lost to the outage leaves the delivery pending: redelivered.
                with contextlib.suppress(BusUnavailableError):
                    await delivery.ack()

    producer = asyncio.create_task(produce())
    reader = asyncio.create_task(consume())
    try:
        await eventually(lambda: len(consumed) >= 50, what="consuming before the crash")
        redis_server.kill()
        await redis_server.wait_exit()
        await eventually(lambda: "offline" in transitions, timeout=5, what="offline event")
        # Held down until a push that waited for the shard gave up (the producer pushes
        # one at a time: the first failure is the push in flight at the kill).
        await eventually(lambda: len(failures) >= 2, timeout=5, what="pushes failing in the outage")
        before_restart = len(pushed)

        await redis_server.start()
        await eventually(
            lambda: transitions[-1] == "online", timeout=10, what="online event after restart"
        )
        await eventually(
            lambda: len(pushed) >= before_restart + 50, timeout=10, what="pushes resumed"
        )
        stop_producing.set()
        await producer

        await eventually(lambda: set(pushed) <= consumed, timeout=15, what="all pushed consumed")

        async def all_acked() -> bool:
            return await queue.count() == 0

        await eventually(all_acked, timeout=10, what="every delivery acked")
        assert not reader.done(), "the consumer gave up instead of resuming"
    finally:
        stop_producing.set()
        consumer.stop()
        await asyncio.wait_for(asyncio.gather(producer, reader, return_exceptions=True), 10)
    reader.result()  # the consumer ended without an error

    # Back online for good: no call fails on a connection pooled before the crash.
    assert transitions == ["offline", "online"]
    assert all(isinstance(exc, BusUnavailableError | BusTimeoutError) for exc in failures)
    assert len(set(pushed)) == len(pushed) and pushed == sorted(pushed), "an id was reused"
    assert set(pushed) <= consumed, "a message whose push returned was lost"
    last = await queue.last_id()
    assert consumed <= set(range(1, last + 1))
    # Extra ids can only be pushes that failed on the connection after being applied.
    assert len(consumed - set(pushed)) <= len(failures)
    assert deliveries >= len(consumed)


# -- 4. shards --------------------------------------------------------------------------------


async def test_adding_a_shard_strands_no_queue(tmp_path: Path) -> None:
    names = [f"orders.{i}" for i in range(30)]
    per_queue = 5
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(RedisServer(tmp_path / f"shard{i}")) for i in range(3)
        ]
        new_shard = servers[2]
        identities = [shard_identity(s.url) for s in servers]
        moved = [n for n in names if rank(identities, n)[0] == 2]
        assert moved, "no queue would be placed on the new shard: the test proves nothing"

        async with Bus(fast_settings([s.url for s in servers[:2]])) as old:
            for name in names:
                queue = old.queue(name)
                await queue.attach(ttl=60)
                await queue.push_batch([f"{name}#{k}" for k in range(per_queue)])
        new_client = new_shard.client()
        try:
            assert await new_client.dbsize() == 0

            async with Bus(fast_settings([s.url for s in servers])) as bus:
                for name in names:
                    queue = bus.queue(name)
                    assert await queue.exists(), name
                    async with queue:
                        assert await queue.count() == per_queue, name
                        async with queue.consume(Mode.AT_MOST_ONCE, max=per_queue) as consumer:
                            got = [delivery.data async for delivery in consumer]
                        assert got == [f"{name}#{k}" for k in range(per_queue)], name
                        assert await queue.count() == 0
                # Nothing was created on the new shard for the existing queues...
                assert await new_client.dbsize() == 0
                # ...while a new queue that ranks it first does go there.
                fresh = next(
                    f"fresh.{i}" for i in range(1000) if rank(identities, f"fresh.{i}")[0] == 2
                )
                async with bus.queue(fresh) as queue:
                    await queue.push("new")
                    assert await key_count(new_shard, fresh) > 0
        finally:
            await new_client.aclose()


# -- 5. embedded Redis -----------------------------------------------------------------------


async def test_embedded_redis_keeps_data_across_bus_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BUSMQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("BUSMQ_REDIS_URLS", raising=False)

    bus = Bus()  # no URL anywhere: an embedded redis-server in BUSMQ_DATA_DIR
    await bus.connect()
    loop = asyncio.get_running_loop()
    try:
        assert bus.embedded is not None
        assert bus.embedded.data_dir == tmp_path / "data"
        socket_path = Path(bus.embedded.socket_path)
        info = await bus.shards[0].client.info("server")
        pid = int(info["process_id"])
        queue = bus.queue("durable")
        assert await queue.attach(ttl=3600)
        ids = await queue.push_batch([b"raw", "text", {"json": [1, 2]}])
    finally:
        closing = loop.time()
        await bus.close()
    # SHUTDOWN ends the connection: close must not retry it for seconds.
    assert loop.time() - closing < 2.0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the server is gone (and reaped), not left behind
    assert not await asyncio.to_thread(socket_path.exists)

    async with Bus() as again:
        assert again.embedded is not None
        queue = again.queue("durable")
        assert await queue.exists()
        assert not await queue.attach()  # it existed: not created anew
        async with queue.consume(Mode.AT_MOST_ONCE, max=3) as consumer:
            got = [(d.id, d.data) async for d in consumer]
        assert got == list(zip(ids, [b"raw", "text", {"json": [1, 2]}], strict=True))


async def test_close_stops_the_health_monitor_even_if_a_probe_swallows_its_cancellation(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    # Seen after failovers: a client library turned the cancellation of a probe in
    # flight into a connection error, the monitor survived it and close() waited forever.
    bus: Bus = await make_bus([redis_server.url])
    shard = bus.shards[0]
    probing = asyncio.Event()

    async def stubborn_probe() -> None:
        probing.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise redis.exceptions.ConnectionError("connection closed while probing") from None

    shard._probe = stubborn_probe  # type: ignore[method-assign]
    shard._wake_monitor.set()  # probe now
    await probing.wait()
    closing = asyncio.create_task(shard.close())
    # A bound on a hang, not a timing claim: a monitor that survives never lets it end.
    done, _ = await asyncio.wait([closing], timeout=30)
    assert closing in done, "close() is stuck behind the health monitor"
    assert shard._monitor is not None and shard._monitor.done()
    assert shard.state.value == "closed"


@pytest.mark.slow
async def test_the_readme_loops_ride_through_redis_restarts(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    # Three restarts, each shorter than failover_timeout: the consumer's loop (no error
    # handling) never raises, and only a push in flight at a kill raises (retried).
    bus = await make_bus([redis_server.url], failover_timeout=20.0)
    ledger = Ledger()
    async with bus.queue("riding"):
        consumer = asyncio.create_task(consume(bus, "riding", ledger))
        producer = asyncio.create_task(produce(bus, "riding", ledger, range(3_000)))
        try:
            for at in (500, 1_200, 2_000):
                await eventually(lambda at=at: len(ledger.acknowledged) >= at, timeout=60)  # type: ignore[misc]
                redis_server.kill()
                await redis_server.wait_exit()
                await redis_server.start()
            await asyncio.wait_for(producer, 120)
            await bus.queue("riding").push({"n": END})
            await asyncio.wait_for(consumer, 60)  # raises what the loop raised
        finally:
            for task in (producer, consumer):
                task.cancel()
            await asyncio.gather(producer, consumer, return_exceptions=True)
    assert len(ledger.acknowledged) == 3_000
    assert not ledger.missing()
    assert not ledger.stored_twice_without_a_retry()
    assert len(ledger.push_errors) <= 3, ledger.push_errors  # one in flight per kill at most
    # Each says which request id to retry with.
    assert all(isinstance(e, BusUnavailableError) and e.request_id for e in ledger.push_errors)
    print(f"\n3 restarts: {ledger.deliveries} deliveries, {len(ledger.push_errors)} push errors")


async def test_an_at_least_once_consumer_hands_nothing_out_while_its_shard_is_offline(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    # Its read-ahead waits for the probe that brings the shard back (which would have it
    # given back if the master had moved); here the same server came back, so the same
    # deliveries come next, in order, handed out only once the shard is online.
    bus = await make_bus([redis_server.url], operation_timeout=1.0)
    shard = bus.shards[0]
    offline = asyncio.Event()
    bus.events.on(lambda event: offline.set() if event.kind == "offline" else None)
    queue = bus.queue("held-back")
    await queue.attach()
    ids = await queue.push_batch([f"m{i}" for i in range(20)])
    handed_out: list[tuple[int, int, ShardState]] = []
    async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=20, visibility_timeout=60) as c:
        first = await anext(c)
        await first.ack()
        redis_server.kill()
        await redis_server.wait_exit()
        await offline.wait()
        rest = asyncio.create_task(collect(c, 19, handed_out, shard))
        await redis_server.start()  # from its append-only file: the same deliveries pending
        await asyncio.wait_for(rest, 30)
    assert [i for i, _, _ in handed_out] == ids[1:]
    assert {state for _, _, state in handed_out} == {ShardState.ONLINE}
    assert {count for _, count, _ in handed_out} == {1}  # the same master: not given back


async def collect(
    consumer: Consumer, n: int, into: list[tuple[int, int, ShardState]], shard: Shard
) -> None:
    """Hand out ``n`` deliveries, noting the shard's state as each is handed out."""
    while len(into) < n:
        delivery = await anext(consumer)
        into.append((delivery.id, delivery.delivery_count, shard.state))


async def test_closing_a_consumer_during_an_outage_ends_an_iteration_held_back(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url], operation_timeout=1.0, failover_timeout=1.0)
    offline = asyncio.Event()
    bus.events.on(lambda event: offline.set() if event.kind == "offline" else None)
    queue = bus.queue("closed-in-outage")
    await queue.attach()
    await queue.push_batch([f"m{i}" for i in range(5)])
    consumer = queue.consume(Mode.AT_LEAST_ONCE, prefetch=5, visibility_timeout=60)
    first = await anext(consumer)
    await first.ack()
    redis_server.kill()
    await redis_server.wait_exit()
    await offline.wait()
    held_back = asyncio.create_task(anext(consumer))
    await consumer.close()  # its give-back fails with the shard down: redelivered later
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(held_back, 10)
