"""One federation target served by several gateway instances: failover between URLs."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from busmq import Bus, BusTimeoutError, BusUnavailableError, Delivery, Mode
from busmq.events import Event
from busmq.federation import FederatedQueue, FederationTarget, LinkState
from tests.federation.conftest import SECRET, DatacenterA, MakeB
from tests.support.gateway_process import GatewayProcess
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually


@dataclass
class Gateway:
    process: GatewayProcess
    proxy: TcpProxy

    @property
    def url(self) -> str:
        return self.proxy.url


@pytest.fixture
async def gateway_2(dc_a: DatacenterA) -> AsyncIterator[Gateway]:
    """A second gateway instance on DC-A's Redis, behind its own proxy."""
    process = GatewayProcess(dc_a.redis.url, (SECRET,))
    await process.start()
    proxy = TcpProxy(process.port)
    await proxy.start()
    try:
        yield Gateway(process, proxy)
    finally:
        await proxy.stop()
        await process.stop()


async def federate_with_fallback(
    make_b: MakeB, dc_a: DatacenterA, gateway_2: Gateway, name: str
) -> tuple[FederatedQueue, list[Event]]:
    """A queue of DC-A federated from a new DC-B bus whose target is gateway 1 (through
    ``dc_a.proxy``) with gateway 2 as fallback; and the link's events, collected."""
    target = FederationTarget(dc_a.url, secret=SECRET, fallback_urls=(gateway_2.url,))
    bus: Bus = await make_b(target=target)
    remote = bus.federate(name, dc_a.url)
    events: list[Event] = []
    remote.link.events.on(events.append)
    assert await remote.link.wait_usable(10)
    assert remote.link.current_url == dc_a.url  # the primary first
    return remote, events


async def settle(delivery: Delivery) -> None:
    """Ack until the outcome is known (an ack that failed may have been applied)."""
    while True:
        try:
            await delivery.ack()  # False: acked already, by the ack that "failed" or a copy
            return
        except (BusUnavailableError, BusTimeoutError):
            await asyncio.sleep(0.05)  # the link is moving; try again


class Collector:
    """An at-least-once consumer of a federated queue that acks everything it gets.

    It acks without waiting for each ack, and its prefetch is not tiny: after a break,
    the gateway's consumer takes over the released deliveries (hundreds were in flight
    in the HTTP/2 windows) ``prefetch`` at a time every ``visibility_timeout / 2``."""

    def __init__(self, remote: FederatedQueue) -> None:
        self.consumer = remote.consume(Mode.AT_LEAST_ONCE, prefetch=100, visibility_timeout=1.0)
        self.ids: set[int] = set()
        self.payloads: set[bytes] = set()
        self.task = asyncio.create_task(self._run())

    def has(self, count: int) -> bool:
        """Whether ``count`` distinct messages were consumed; raises if it ended."""
        if self.task.done():
            self.task.result()  # what ended it, if anything
            raise AssertionError("the consumer ended")
        return len(self.ids) >= count

    async def _run(self) -> None:
        acks: set[asyncio.Task[None]] = set()
        async with self.consumer:
            async for delivery in self.consumer:
                self.ids.add(delivery.id)
                self.payloads.add(delivery.payload)
                # Acks made in one tick go in one call: do not wait for each.
                ack = asyncio.create_task(settle(delivery))
                acks.add(ack)
                ack.add_done_callback(acks.discard)
            await asyncio.gather(*acks)

    async def stop(self) -> None:
        self.consumer.stop()
        await self.task


async def test_pushes_and_a_consumer_fail_over_to_the_second_gateway_and_lose_nothing(
    dc_a: DatacenterA, gateway_2: Gateway, make_b: MakeB
) -> None:
    await dc_a.bus.queue("orders").attach(ttl=120)
    remote, events = await federate_with_fallback(make_b, dc_a, gateway_2, "orders")
    await remote.attach()
    collector = Collector(remote)
    total, batch = 3000, 20
    queued = 0
    for first in range(0, total, batch):
        if first == total // 3:
            await eventually(lambda: collector.has(200), what="consumed before the cut")
            await dc_a.proxy.cut()  # gateway 1 is gone for good
        ids = await remote.push_batch([b"%d" % i for i in range(first, first + batch)])
        queued += ids is None

    await eventually(lambda: collector.has(total), timeout=30, what="all consumed")
    # The last rows are consumed before the forwarder has deleted them from the outbox.
    await eventually(lambda: remote.outbox_depth == 0, what="the outbox drained")
    assert collector.ids == set(range(1, total + 1))  # nothing lost, nothing stray
    assert collector.payloads == {b"%d" % i for i in range(total)}
    assert await dc_a.bus.queue("orders").last_id() == total  # each push stored once
    assert queued >= 1  # the push that met the cut went to the outbox, then via gateway 2
    assert remote.link.current_url == gateway_2.url
    assert remote.link.failovers == 1 and remote.link.state.usable
    failovers = [e.details for e in events if e.kind == "failover"]
    assert failovers == [{"from": dc_a.url, "to": gateway_2.url}]
    ready = [e for e in events if e.kind == "state" and e.details["state"] == "ready"]
    assert ready[-1].details["url"] == gateway_2.url
    assert collector.consumer.reconnects >= 1  # the stream resumed on gateway 2
    await collector.stop()
    assert remote.target == dc_a.url  # the identity stays

    async def all_acked() -> bool:
        return await dc_a.bus.queue("orders").count() == 0

    await eventually(all_acked, what="every delivery acked in A")


async def test_a_stream_on_a_hung_gateway_moves_to_the_other_one(
    dc_a: DatacenterA, gateway_2: Gateway, make_b: MakeB
) -> None:
    local = dc_a.bus.queue("jobs")
    await local.attach(ttl=120)
    await local.push_batch([b"%d" % i for i in range(200)])
    remote, events = await federate_with_fallback(make_b, dc_a, gateway_2, "jobs")
    collector = Collector(remote)
    await eventually(lambda: collector.has(50), what="consumed before the freeze")
    # Gateway 1 hangs: its connections stay open but nothing answers. The stream just
    # stops; the next call times out, the probe too, and the link fails over. The
    # stream, still open on the old channel, is moved when the old pool is closed.
    dc_a.gateway.signal(signal.SIGSTOP)
    try:
        with pytest.raises(BusTimeoutError):
            await remote.count()
        await eventually(lambda: remote.link.failovers == 1, what="failover")
        await local.push_batch([b"%d" % i for i in range(200, 400)])
        await eventually(lambda: collector.has(400), timeout=30, what="all consumed")
        assert collector.ids == set(range(1, 401))
        assert collector.consumer.reconnects >= 1
        assert remote.link.current_url == gateway_2.url
        await collector.stop()
    finally:
        dc_a.gateway.signal(signal.SIGCONT)
    assert [e.details["to"] for e in events if e.kind == "failover"] == [gateway_2.url]


async def test_with_every_url_down_pushes_wait_in_the_outbox_and_drain_when_one_returns(
    dc_a: DatacenterA, gateway_2: Gateway, make_b: MakeB
) -> None:
    local = dc_a.bus.queue("payments")
    await local.attach(ttl=120)
    remote, events = await federate_with_fallback(make_b, dc_a, gateway_2, "payments")
    assert await remote.push("before") == 1
    await dc_a.proxy.cut()
    await gateway_2.proxy.cut()
    await eventually(lambda: remote.state is LinkState.DISCONNECTED, what="disconnected")
    for i in range(10):
        assert await remote.push(f"during {i}") is None
    assert remote.outbox_depth == 10

    # Probes go round-robin, one per backoff step (0.05 s doubling to 0.5 s, each
    # jittered to 50-100 %): ten of them, nine sleeps apart, take at least 1.625 s
    # however many URLs there are (probing both URLs per step would halve that).
    loop = asyncio.get_running_loop()
    start, started = remote.link.attempts, loop.time()
    await eventually(lambda: remote.link.attempts >= start + 10, what="ten more probes")
    assert loop.time() - started >= 1.6
    probed = [e.details["url"] for e in events if e.kind == "error"]
    assert {dc_a.url, gateway_2.url} <= set(probed[-10:])
    assert remote.state is LinkState.DISCONNECTED

    await gateway_2.proxy.restore()  # the fallback comes back, the primary does not
    await eventually(lambda: remote.outbox_depth == 0, what="outbox drained")
    assert remote.link.current_url == gateway_2.url
    await eventually(lambda: remote.link.state is LinkState.READY, what="ready")
    assert await local.last_id() == 11
    assert await remote.push("after") == 12


async def test_the_link_stays_on_the_url_that_works(
    dc_a: DatacenterA, gateway_2: Gateway, make_b: MakeB
) -> None:
    await dc_a.bus.queue("sticky").attach(ttl=120)
    remote, events = await federate_with_fallback(make_b, dc_a, gateway_2, "sticky")
    await dc_a.proxy.cut()
    await eventually(lambda: remote.link.current_url == gateway_2.url, what="failover")
    await eventually(lambda: remote.link.usable, what="usable via gateway 2")
    await dc_a.proxy.restore()  # the primary is back: no return, no flapping
    assert await remote.push("one") == 1
    assert remote.link.current_url == gateway_2.url
    await gateway_2.proxy.cut()  # now the second fails: back to the first
    await eventually(lambda: remote.link.current_url == dc_a.url, what="failover back")
    await eventually(lambda: remote.link.usable, what="usable via gateway 1")
    assert await remote.push("two") == 2
    moves = [(e.details["from"], e.details["to"]) for e in events if e.kind == "failover"]
    assert moves == [(dc_a.url, gateway_2.url), (gateway_2.url, dc_a.url)]


async def test_a_refused_secret_does_not_rotate_through_the_urls(
    dc_a: DatacenterA, gateway_2: Gateway, make_b: MakeB
) -> None:
    target = FederationTarget(dc_a.url, secret="not-the-secret", fallback_urls=(gateway_2.url,))
    bus: Bus = await make_b(target=target)
    remote = bus.federate("orders", dc_a.url)
    events: list[Event] = []
    remote.link.events.on(events.append)
    await eventually(lambda: remote.state is LinkState.UNAUTHORIZED, what="unauthorized")
    start = remote.link.attempts
    await eventually(lambda: remote.link.attempts >= start + 4, what="four more probes")
    # The credentials are the target's: another URL would refuse them too. The link
    # stays on the URL that answered, with the usual backoff.
    assert {e.details["url"] for e in events if e.kind == "error"} == {dc_a.url}
    assert remote.link.failovers == 0 and remote.link.current_url == dc_a.url
    assert [e.kind for e in events].count("unauthorized") <= 1
    assert remote.state is LinkState.UNAUTHORIZED


def test_target_urls_are_normalized_and_validated() -> None:
    target = FederationTarget(
        "http://Gateway-A1:8443/",
        fallback_urls=["http://gateway-a2:8443", " http://[::1]:9 "],
        allow_plaintext=True,  # plaintext off loopback (see test_transport_security.py)
    )
    assert target.url == "http://gateway-a1:8443"
    assert target.fallback_urls == ("http://gateway-a2:8443", "http://[::1]:9")
    assert target.urls == (target.url, *target.fallback_urls)
    assert FederationTarget("http://a:1", allow_plaintext=True).urls == ("http://a:1",)
    with pytest.raises(ValueError, match="must use https:"):  # TLS for one URL is TLS for all
        FederationTarget("https://a:1", fallback_urls=("http://b:1",))
    with pytest.raises(ValueError, match="twice"):
        FederationTarget(
            "http://a:1", fallback_urls=("http://b:1", "http://B:1/"), allow_plaintext=True
        )
    with pytest.raises(ValueError, match="twice"):
        FederationTarget("http://a:1", fallback_urls=("http://a:1",), allow_plaintext=True)
    with pytest.raises(ValueError, match="port"):
        FederationTarget("http://a:1", fallback_urls=("http://b",), allow_plaintext=True)
    with pytest.raises(ValueError):
        FederationTarget("http://a:1", fallback_urls=("ftp://b:1",), allow_plaintext=True)
    with pytest.raises(ValueError, match="secret"):
        FederationTarget("http://a:1", fallback_urls=("http://user:pw@b:1",), allow_plaintext=True)
    with pytest.raises(TypeError):
        FederationTarget(
            "http://a:1", fallback_urls="http://b:1", allow_plaintext=True
        )  # a str, not a list


async def test_a_channel_end_on_a_hung_gateway_moves_to_the_other_one(
    dc_a: DatacenterA, gateway_2: Gateway, make_b: MakeB
) -> None:
    target = FederationTarget(dc_a.url, secret=SECRET, fallback_urls=(gateway_2.url,))
    bus = await make_b(target=target)
    got_a: list[object] = []
    got_b: list[object] = []

    async def into_a(delivery: Delivery) -> None:
        got_a.append(delivery.data)

    async def into_b(delivery: Delivery) -> None:
        got_b.append(delivery.data)

    peer_a = dc_a.bus.channel("room", "a", "b")
    await peer_a.connect(handler=into_a)
    end_b = bus.federate(bus.channel("room", "a", "b"), dc_a.url)
    assert await end_b.link.wait_usable(10)
    await end_b.listen(Mode.AT_LEAST_ONCE, handler=into_b)
    await peer_a.send(0)
    await eventually(lambda: 0 in got_b, what="first message in B")
    dc_a.gateway.signal(signal.SIGSTOP)
    try:
        # The send times out on the hung gateway: it may or may not have been stored,
        # so it goes to the outbox, and the failed call makes the link fail over.
        assert await end_b.send("sent during the hang") is None
        await eventually(lambda: end_b.link.failovers == 1, what="failover")
        for i in range(1, 21):
            await peer_a.send(i)
        await eventually(lambda: set(range(21)) <= set(got_b), timeout=30, what="all in B")
        await eventually(lambda: "sent during the hang" in got_a, timeout=30, what="in A")
        assert got_a.count("sent during the hang") == 1
        assert end_b.reconnects >= 1
        assert end_b.link.current_url == gateway_2.url
        await end_b.disconnect()
    finally:
        dc_a.gateway.signal(signal.SIGCONT)
    await peer_a.disconnect()


async def test_a_fallback_url_names_the_same_target(
    dc_a: DatacenterA, gateway_2: Gateway, make_b: MakeB
) -> None:
    target = FederationTarget(dc_a.url, secret=SECRET, fallback_urls=(gateway_2.url,))
    bus = await make_b(target=target)
    by_primary = bus.federate("q", dc_a.url)
    by_fallback = bus.federate("q", gateway_2.url)
    assert by_fallback.link is by_primary.link
    assert by_fallback.target == dc_a.url
    manager = bus.federation
    assert manager is not None and manager.link(gateway_2.url) is by_primary.link
    assert list(manager.links) == [dc_a.url]
