"""Three gateways behind nginx, each call to the next: the README's federation calls, a
service served in DC-B, a channel, and the quota and attachment counts, all through
the balancer's one URL."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import pytest

from busmq import Mode, Request
from busmq.federation import FederatedService
from busmq.keys import CONSUMER_GROUP, QueueKeys
from tests.fleet.conftest import Fleet
from tests.support.heavy import cpu_heavy
from tests.support.waiting import eventually


async def leases(fleet: Fleet, queue: str) -> int:
    """The attachments of ``queue`` in DC-A's Redis."""
    store = fleet.a.queue(queue).store
    key = QueueKeys(queue).leases
    return int(await store.run(lambda c: c.zcard(key), idempotent=True))


async def test_the_readme_federation_calls_through_the_balancer(fleet: Fleet) -> None:
    orders = fleet.b.federate(fleet.b.queue("orders"), fleet.url)
    async with orders:
        # The bus renews the lease every lease/3 (1 s here): renewals land on every gateway.
        for _ in range(4):
            assert await orders.renew()
        assert await leases(fleet, "orders") == 1  # one async with, one attachment
        ids = [await orders.push({"order": n}) for n in range(30)]
        assert all(isinstance(i, int) for i in ids)
        got: list[Any] = []
        async with orders.consume(Mode.AT_LEAST_ONCE) as consumer:
            async for delivery in consumer:
                got.append(delivery.data["order"])
                await delivery.ack()  # each ack to the next gateway
                if len(got) == 30:
                    break
        assert got == list(range(30))
    assert await leases(fleet, "orders") == 0
    info = await fleet.a.queue("orders").info()
    assert info.pending == 0

    chat_a = fleet.a.channel("chat", "a", "b")
    await chat_a.connect()
    chat_b = fleet.b.federate(fleet.b.channel("chat", "b", "a"), fleet.url)
    await chat_b.connect(Mode.AT_LEAST_ONCE)
    for n in range(6):
        await chat_b.send(f"hello {n}")  # each send to the next gateway, relayed
    received = []
    async for delivery in chat_a:
        received.append(delivery.data)
        if len(received) == 6:
            break
    assert received == [f"hello {n}" for n in range(6)]
    await chat_b.disconnect()

    profile = fleet.a.persistable("user:42", ["name"])
    profile["name"] = "Ada"
    await profile.save()
    remote_profile = fleet.b.federate(fleet.b.persistable("user:42", ["name"]), fleet.url)
    await remote_profile.load()
    assert remote_profile["name"] == "Ada"


async def test_a_service_served_in_dc_b_answers_every_request(fleet: Fleet) -> None:
    """The Serve stream is on one gateway; each Reply lands on the next, which relays it."""
    remote = fleet.b.federate(fleet.b.service("pricing"), fleet.url)
    assert isinstance(remote, FederatedService)

    async def handler(request: Request) -> Any:
        return {"quote": request.data["sku"], "by": "dc-b"}

    started = asyncio.Event()
    remote.events.on(lambda event: started.set() if event.kind == "serving" else None)
    serving = asyncio.create_task(remote.serve(handler, concurrency=4))
    try:
        await asyncio.wait_for(started.wait(), 10)
        requester = fleet.a.service("pricing")
        answers = [await requester.request({"sku": f"A{n}"}, timeout=10) for n in range(12)]
        assert answers == [{"quote": f"A{n}", "by": "dc-b"} for n in range(12)]
        await requester.close()
    finally:
        remote.stop_serving()
        await asyncio.gather(serving, return_exceptions=True)


class Flow:
    """~1,000 msg/s pushed in DC-A (10 every 10 ms) while DC-B's README loop consumes
    them through the balancer, acking each: what was pushed, acked and redelivered."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.pushed: list[int] = []
        self.acked: set[int] = set()
        self.redelivered = 0
        self._producing = True

    async def produce(self) -> None:
        queue = self.fleet.a.queue("flow")
        async with queue:
            n = 0
            while self._producing:
                self.pushed += await queue.push_batch([f"m{n + i}" for i in range(10)])
                n += 10
                await asyncio.sleep(0.01)  # the pace: 10 messages per 10 ms

    async def consume(self) -> None:
        """The README's consumer loop, unchanged: it runs until cancelled and must never
        end with an error."""
        flow = self.fleet.b.federate(self.fleet.b.queue("flow"), self.fleet.url)
        async with flow, flow.consume(Mode.AT_LEAST_ONCE, visibility_timeout=5) as consumer:
            async for delivery in consumer:
                if delivery.delivery_count > 1:
                    self.redelivered += 1
                await delivery.ack()
                self.acked.add(delivery.id)

    def stop_producing(self) -> None:
        self._producing = False

    async def acks_grow_by(self, n: int, consumer: asyncio.Task[None]) -> None:
        target = len(self.acked) + n
        await self._until(lambda: len(self.acked) >= target, consumer, 30, f"{n} more acks")

    async def all_acked(self, consumer: asyncio.Task[None], stall: float) -> None:
        """Every push acked (the loop may have acked the last before the producer
        stopped: the test waits on the acks, not on another delivery). The backlog the
        chaos left (thousands of pushes, each acked in its turn by the README loop) drains
        at whatever pace the machine allows: the test fails when the acks stop growing
        for ``stall`` seconds, not after a fixed time."""
        while not self.acked.issuperset(self.pushed):
            count = len(self.acked)
            await self._until(
                lambda count=count: len(self.acked) > count, consumer, stall, "a new ack"
            )

    @staticmethod
    async def _until(
        reached: Callable[[], bool], consumer: asyncio.Task[None], timeout: float, what: str
    ) -> None:
        def check() -> bool:
            if consumer.done():
                consumer.result()  # the loop ended: its error is the test's
                raise AssertionError("the consumer loop ended")
            return reached()

        await eventually(check, timeout=timeout, what=what)


async def report_stall(fleet: Fleet, flow: Flow) -> None:
    """What a stalled flow looks like, printed for the failure report: the pushes not
    acked, DC-A's queue and consumer group, DC-B's link, and where each task waits."""
    missing = sorted(set(flow.pushed) - flow.acked)
    print(f"stall: {len(missing)} pushes not acked, from {missing[:5]}")
    print(f"stall: queue {await fleet.a.queue('flow').info()}")
    admin = fleet.redis.client()
    try:
        stream = QueueKeys("flow").stream
        print(f"stall: groups {await admin.xinfo_groups(stream)}")
        print(f"stall: consumers {await admin.xinfo_consumers(stream, CONSUMER_GROUP)}")
    finally:
        await admin.aclose()
    federation = fleet.b.federation
    if federation is not None:
        print(f"stall: DC-B {await federation.status()}")
    for task in asyncio.all_tasks():
        print(f"stall: task {task.get_name()}: {' -> '.join(awaiting(task.get_coro()))}")


def awaiting(coroutine: Any) -> list[str]:
    """Where a coroutine waits, outermost first, through what it awaits."""
    found: list[str] = []
    while coroutine is not None and len(found) < 12:
        frame = getattr(coroutine, "cr_frame", None) or getattr(coroutine, "ag_frame", None)
        if frame is not None:
            found.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "ag_await", None)
    return found


@cpu_heavy
@pytest.mark.slow
@pytest.mark.timeout(300)  # 20-30 s alone; beside the Spark JVM under coverage on a slow VM, 112 s
async def test_a_killed_gateway_and_a_rolling_restart_lose_nothing(fleet: Fleet) -> None:
    """SIGKILL one gateway, then restart all three one by one (SIGTERM: drain), under
    1,000 msg/s: every acknowledged push is consumed, the loop never raises."""
    flow = Flow(fleet)
    await fleet.a.queue("flow").attach(ttl=120)
    producer = asyncio.create_task(flow.produce())
    consumer = asyncio.create_task(flow.consume())
    try:
        await flow.acks_grow_by(500, consumer)
        victim = fleet.gateways[0]
        victim.signal(signal.SIGKILL)
        await victim.wait()
        await flow.acks_grow_by(1000, consumer)  # served by the other two
        await victim.start()
        for gateway in fleet.gateways:  # a rolling restart
            gateway.signal(signal.SIGTERM)
            assert await gateway.wait() == 0
            await flow.acks_grow_by(300, consumer)
            await gateway.start()
        await flow.acks_grow_by(500, consumer)
        flow.stop_producing()
        await producer
        try:
            await flow.all_acked(consumer, stall=30)
        except AssertionError:
            await report_stall(fleet, flow)
            raise
    finally:
        flow.stop_producing()
        for task in (producer, consumer):
            if not task.done():
                task.cancel()
        await asyncio.gather(producer, consumer, return_exceptions=True)
    assert flow.acked.issuperset(flow.pushed)  # nothing acknowledged in DC-A was lost
    print(
        f"fleet chaos: {len(flow.pushed)} pushed, {len(flow.acked)} acked, "
        f"{flow.redelivered} redelivered"
    )
