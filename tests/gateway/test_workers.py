"""``busmq-gateway --workers 2``: two processes on one port over the one embedded Redis
the supervisor starts. A worker SIGKILLed during an at-least-once consume and push run:
the client resumes on a live worker, every push that was acknowledged is consumed, the
worker is restarted; SIGTERM drains both and the supervisor exits 0. The supervisor's
``/metrics`` sums what the workers counted."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from pathlib import Path

import grpc
import psutil
import pytest

from busmq import Bus, BusUnavailableError, Mode, UnknownMessageError
from busmq.federation import FederationSettings, FederationTarget
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2
from tests.conftest import fast_settings
from tests.federation.conftest import FAST_LINK
from tests.support.gateway_process import gateway_env, spawn_until_ready
from tests.support.redis_server import RedisServer, free_port
from tests.support.scrape import scrape
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

SECRET = "workers-secret-0123456789"
TOTAL = 3000


def workers_of(supervisor: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(supervisor).children() if "python" in p.name()]


def holding(workers: list[psutil.Process], port: int) -> list[psutil.Process]:
    """The workers that hold a client connection to ``port``."""
    return [
        worker for worker in workers
        if any(c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
               for c in worker.net_connections("tcp"))
    ]  # fmt: skip


def serving_client(workers: list[psutil.Process], port: int) -> psutil.Process:
    """A worker that holds one of the client's connections to ``port``."""
    for worker in holding(workers, port):
        return worker
    raise AssertionError("no worker holds a connection")


async def test_a_killed_worker_loses_nothing_acknowledged_and_sigterm_drains_all(
    tmp_path: Path,
) -> None:
    port, http = free_port(), free_port()
    env = gateway_env()
    env |= {"BUSMQ_DATA_DIR": str(tmp_path / "embedded"), "BUSMQ_LEASE_SECONDS": "3"}
    supervisor, output = await spawn_until_ready(
        sys.executable, "-m", "busmq_gateway", "--workers", "2", "--listen", f"127.0.0.1:{port}",
        "--http-listen", f"127.0.0.1:{http}", f"--secret={SECRET}", "--log-format", "text",
        "--grace-seconds", "3", env=env, timeout=60,
    )  # fmt: skip
    try:
        assert re.search(r"ready on port \d+, http on port \d+ \(2 workers", output[-1])
        children = psutil.Process(supervisor.pid).children()
        assert len([p for p in children if "redis" in p.name()]) == 1  # one embedded Redis
        workers = workers_of(supervisor.pid)
        assert len(workers) == 2

        async with RedisServer(tmp_path / "remote-redis") as remote, Bus(
            fast_settings([remote.url])
        ) as bus:  # fmt: skip
            target = FederationTarget(f"http://127.0.0.1:{port}", secret=SECRET)
            bus.configure_federation(FederationSettings(
                targets=[target], outbox_path=tmp_path / "outbox.sqlite3", **FAST_LINK
            ))  # fmt: skip
            queue = bus.federate("work", target.url)
            await queue.attach(ttl=120)
            pushed: list[int] = []
            acked: set[int] = set()
            killed = asyncio.Event()
            quarter = asyncio.Event()

            async def produce() -> None:
                for n in range(TOTAL // 50):
                    ids = await queue.push_batch([f"m{n}-{i}" for i in range(50)])
                    if ids is not None:  # None: kept in the outbox, forwarded later
                        pushed.extend(ids)
                    if n == TOTAL // 100:
                        await killed.wait()

            async def consume() -> None:
                async with queue.consume(
                    Mode.AT_LEAST_ONCE, prefetch=50, visibility_timeout=2.0
                ) as consumer:
                    async for delivery in consumer:
                        # An ack refused, or cut by the kill, did not happen: the
                        # message comes again (at least once) and is acked then.
                        with contextlib.suppress(UnknownMessageError, BusUnavailableError):
                            await delivery.ack()
                            acked.add(delivery.id)
                        if len(acked) >= TOTAL // 4:
                            quarter.set()
                        if len(acked) >= TOTAL:
                            return

            consuming = asyncio.create_task(consume())
            producing = asyncio.create_task(produce())
            await asyncio.wait_for(quarter.wait(), 30)
            victim = serving_client(workers, port)
            victim.kill()
            killed.set()
            try:
                await asyncio.wait_for(producing, 30)
                await asyncio.wait_for(consuming, 30)
            except TimeoutError:
                raise AssertionError(f"stalled: {len(pushed)} pushed, {len(acked)} acked") from None
            outbox = bus.federation.outbox if bus.federation else None
            assert outbox is not None and outbox.depth() == 0

        # Every push that was acknowledged (an id, or the outbox, forwarded since) was
        # consumed and acked.
        assert len(acked) == TOTAL
        assert set(pushed) <= acked
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = queue_service_pb2_grpc.QueueServiceStub(channel)
            auth = (("authorization", f"Bearer {SECRET}"),)
            info = await stub.GetQueue(pb.GetQueueRequest(queue="work"), metadata=auth)
            assert (info.count, info.pending, info.last_id) == (0, 0, TOTAL)

        # The killed worker was replaced; the supervisor's /metrics sums the workers.
        now = workers_of(supervisor.pid)
        assert len(now) == 2 and victim.pid not in {p.pid for p in now}
        samples = await scrape(f"http://127.0.0.1:{http}/metrics")
        assert samples["busmq_gateway_workers_up", {}] == 2
        started = sum(
            samples["grpc_server_started_total", labels]
            for labels in samples.labels_of("grpc_server_started_total")
            if labels["grpc_method"] in ("PushStream", "PushMany")
        )
        assert started >= 1

        supervisor.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(supervisor.wait(), 60) == 0
        assert not any(p.is_running() and p.status() != "zombie" for p in now)
        assert not any(p.is_running() and p.status() != "zombie" for p in children)
    finally:
        if supervisor.returncode is None:
            supervisor.kill()
            await supervisor.wait()


async def test_workers_do_not_outlive_a_killed_supervisor(tmp_path: Path) -> None:
    async with RedisServer(tmp_path / "redis") as redis:
        env = gateway_env()
        supervisor, _ = await spawn_until_ready(
            sys.executable, "-m", "busmq_gateway", "--workers", "2",
            "--listen", f"127.0.0.1:{free_port()}", "--http-listen", "off",
            "--redis-url", redis.url, f"--secret={SECRET}", "--grace-seconds", "2", env=env,
        )  # fmt: skip
        workers = workers_of(supervisor.pid)
        assert len(workers) == 2
        supervisor.kill()
        await supervisor.wait()
        _gone, alive = await asyncio.to_thread(psutil.wait_procs, workers, timeout=20)
        for orphan in alive:  # so that a failure does not leave them serving
            orphan.kill()
        assert not alive, "workers outlived their supervisor"


async def test_the_supervisor_sums_what_the_workers_counted(tmp_path: Path) -> None:
    async with RedisServer(tmp_path / "redis") as redis:
        port, http = free_port(), free_port()
        env = gateway_env()
        supervisor, _ = await spawn_until_ready(
            sys.executable, "-m", "busmq_gateway", "--workers", "2",
            "--listen", f"127.0.0.1:{port}", "--http-listen", f"127.0.0.1:{http}",
            "--redis-url", redis.url, f"--secret={SECRET}", "--grace-seconds", "2", env=env,
        )  # fmt: skip
        auth = (("authorization", f"Bearer {SECRET}"),)
        channels: list[grpc.aio.Channel] = []
        streams: list[grpc.aio.UnaryStreamCall] = []  # type: ignore[type-arg]
        try:
            workers = workers_of(supervisor.pid)
            # Connections until both workers hold one (the kernel spreads connections).
            while len(holding(workers, port)) < 2:
                assert len(channels) < 64, "every connection landed on one worker"
                channel = grpc.aio.insecure_channel(
                    f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
                )
                channels.append(channel)
                stub = queue_service_pb2_grpc.QueueServiceStub(channel)
                await stub.AttachQueue(pb.AttachQueueRequest(queue="tallied"), metadata=auth)
            stubs = [queue_service_pb2_grpc.QueueServiceStub(c) for c in channels]
            received = 0
            all_received = asyncio.Event()

            async def consume(stub: queue_service_pb2_grpc.QueueServiceStub) -> None:
                nonlocal received
                call = stub.Consume(pb.ConsumeRequest(queue="tallied"), metadata=auth)
                streams.append(call)
                async for response in call:
                    if response.HasField("delivery"):
                        received += 1
                        if received == 200:
                            all_received.set()

            readers = [asyncio.create_task(consume(stub)) for stub in stubs]

            async def streams_open() -> bool:
                samples = await scrape(f"http://127.0.0.1:{http}/metrics")
                return samples.get("busmq_gateway_active_streams") == len(stubs)

            await eventually(streams_open, what="every stream open")
            samples = await scrape(f"http://127.0.0.1:{http}/metrics")
            assert (samples.get("busmq_gateway_asyncio_tasks") or 0) > 0  # every worker's
            assert samples.get("busmq_gateway_relayed_calls_total") is not None
            messages = [types_pb2.OutgoingMessage(payload=b"%d" % i) for i in range(10)]
            for i in range(20):  # 20 pushes of 10 messages, over every connection
                stub = stubs[i % len(stubs)]
                await stub.Push(pb.PushRequest(queue="tallied", messages=messages), metadata=auth)
            await asyncio.wait_for(all_received.wait(), 20)
            garbage = channels[0].unary_unary("/busmq.v1.QueueService/GetQueue")
            with pytest.raises(grpc.aio.AioRpcError):
                await garbage(b"\xff\xff\xff", metadata=auth)

            async def summed() -> bool:
                samples = await scrape(f"http://127.0.0.1:{http}/metrics")
                tallied = {"queue": "tallied"}
                return (
                    samples.get("busmq_client_pushed_total", tallied) == 200
                    and samples.get("busmq_client_delivered_total", tallied) == 200
                    and samples.get("busmq_gateway_malformed_requests") == 1
                )

            await eventually(summed, what="the workers' figures summed")
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

            async def streams_closed() -> bool:
                samples = await scrape(f"http://127.0.0.1:{http}/metrics")
                return samples.get("busmq_gateway_active_streams") == 0

            await eventually(streams_closed, what="the streams counted closed")
        finally:
            for channel in channels:
                await channel.close()
            supervisor.send_signal(signal.SIGTERM)
            await asyncio.wait_for(supervisor.wait(), 60)
