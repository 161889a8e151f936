"""A federated queue has the queue API and events; errors come back as busmq exceptions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from busmq import (
    Bus,
    Event,
    InvalidNameError,
    Mode,
    ModeConflictError,
    QueueFullError,
    QueueNotFoundError,
    UnknownMessageError,
)
from busmq.federation import (
    FederationSettings,
    FederationTarget,
    FederationUnauthorizedError,
    InvalidRequestError,
    LinkState,
)
from busmq.federation.queue import renewal_waits
from tests.conftest import fast_settings
from tests.federation.conftest import FAST_LINK, SECRET, DatacenterA, MakeB
from tests.support.certs import make_pki
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.also_on_uvloop  # the same tests on uvloop's event loop


async def test_a_federated_queue_pushes_consumes_and_inspects_like_a_local_one(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.queue("orders"), dc_a.url)
    events: list[Event] = []
    remote.events.on(events.append)
    assert await remote.link.wait_usable(10)
    assert await remote.attach(ttl=60) is True
    assert await remote.push({"n": 1}, headers={"source": "b"}) == 1
    assert await remote.push_batch(["two", b"\x03"]) == [2, 3]
    assert await remote.count() == 3 and await remote.exists() and await remote.last_id() == 3
    ttl = await remote.ttl()
    assert ttl is not None and ttl > 50
    await remote.set_metadata({"owner": "dc-b"})
    assert await remote.metadata() == {"owner": "dc-b"}

    async with remote.consume(Mode.AT_LEAST_ONCE, max=3) as consumer:
        got = [delivery async for delivery in consumer]
    assert [d.data for d in got] == [{"n": 1}, "two", b"\x03"]
    assert got[0].headers == {"source": "b"} and got[0].message.timestamp_ms > 0
    await got[0].ack()
    assert await remote.ack(2, 3) == 2
    with pytest.raises(UnknownMessageError):
        await remote.ack(3)
    assert remote.pushed == 3 and remote.consumed == 3
    lag = await remote.lag()
    assert lag.messages == 0 and lag.last_delivered_id == 3

    # The local core sees the same queue: it lives in A.
    assert await dc_a.bus.queue("orders").metadata() == {"owner": "dc-b"}
    with pytest.raises(ModeConflictError):
        async with remote.consume(Mode.REPLAY):
            pass
    with pytest.raises(InvalidRequestError):  # above the gateway's max_prefetch
        async with remote.consume(prefetch=5000):
            pass
    await remote.flush()
    assert await remote.count() == 0
    await remote.close()
    assert not await remote.exists() and not remote.attached
    with pytest.raises(QueueNotFoundError):
        await remote.push("to a closed queue")
    with pytest.raises(InvalidNameError):
        dc_b.federate("no spaces allowed", dc_a.url)

    kinds = [(e.kind, e.source) for e in events]
    assert ("ready", remote.target) in kinds
    for kind in ("attached", "consuming", "stopped", "closed"):
        assert (kind, "orders") in kinds


async def test_a_federated_push_takes_a_durability_and_its_caller_may_renew_the_lease(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    # The queue API is written once (busmq.queue_api): what a local queue takes, a
    # federated one takes too.
    remote = dc_b.federate("durable-remote", dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach(auto_renew=False)
    try:
        renewers = [t for t in asyncio.all_tasks() if "federated-renewal" in t.get_name()]
        assert renewers == []
        assert await remote.push(b"x", durability="async") == 1
        with pytest.raises(ValueError, match="durability"):
            await remote.push(b"y", durability="eventually")
        assert await remote.renew() is True
        assert await remote.count() == 1
        with pytest.raises(ValueError, match="max_deliveries"):
            await remote.set_max_deliveries(0)
    finally:
        await remote.detach()
    assert not remote.attached


async def test_detach_lets_the_remote_queue_expire(dc_a: DatacenterA, dc_b: Bus) -> None:
    remote = dc_b.federate("short-lived", dc_a.url)
    async with remote:
        assert remote.attached
        await asyncio.sleep(0)  # one turn of the loop inside the block
    assert not remote.attached
    ttl = await remote.ttl()
    assert ttl is not None and ttl <= 30


async def test_a_wrong_secret_is_reported_as_unauthorized_without_a_retry_storm(
    dc_a: DatacenterA, make_b: MakeB
) -> None:
    bus = await make_b(
        secret="not-the-secret", reconnect_backoff_initial=0.1, reconnect_backoff_max=2.0
    )
    remote = bus.federate("orders", dc_a.url)
    events: list[str] = []
    remote.events.on(lambda event: events.append(event.kind))
    await eventually(lambda: remote.state is LinkState.UNAUTHORIZED, what="unauthorized")
    start = remote.link.attempts
    await asyncio.sleep(3)  # the observation window, not a wait for something to happen
    attempts = remote.link.attempts - start
    assert 1 <= attempts <= 8, attempts  # exponential backoff, not hundreds of calls
    assert events.count("unauthorized") == 1
    with pytest.raises(FederationUnauthorizedError):
        await remote.push("refused")
    with pytest.raises(FederationUnauthorizedError):
        await remote.attach()
    with pytest.raises(FederationUnauthorizedError):
        await remote.consume().start()
    assert remote.outbox_depth == 0


async def test_federation_over_mutual_tls(tmp_path: Path, redis_server: RedisServer) -> None:
    ca, server, client = make_pki(tmp_path)
    tls = ("--tls-cert", str(server.cert), "--tls-key", str(server.key))
    gateway = GatewayProcess(redis_server.url, (SECRET,), *tls, "--tls-client-ca", str(ca.cert))
    await gateway.start()
    bus = Bus(fast_settings([redis_server.url]))
    try:
        target = FederationTarget(
            f"https://127.0.0.1:{gateway.port}",
            secret=SECRET,
            root_ca_file=str(ca.cert),  # a str is taken as a path, as a Path is
            client_cert_file=client.cert,
            client_key_file=str(client.key),
        )
        settings = FederationSettings(
            targets=[target], outbox_path=tmp_path / "outbox.sqlite3", **FAST_LINK
        )
        bus.configure_federation(settings)
        remote = bus.federate("secure", target.url)
        assert await remote.link.wait_usable(10)
        async with remote:
            assert await remote.push("over mTLS") == 1
            async with remote.consume(max=1) as consumer:
                assert [d.data async for d in consumer] == ["over mTLS"]
    finally:
        await bus.close()
        await gateway.stop()


async def test_attach_with_max_backlog_zero_removes_a_limit_remotely_as_it_does_locally(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    async def steps(new_handle: Callable[[], Any]) -> list[object]:
        """Set a limit, keep it (None), remove it (0): what each push did."""
        outcomes: list[object] = []
        for max_backlog, pushes in ((1, 2), (None, 1), (0, 3)):
            handle = new_handle()
            await handle.attach(ttl=60, max_backlog=max_backlog)
            for i in range(pushes):
                try:
                    await handle.push(f"{max_backlog}.{i}")
                except QueueFullError as full:
                    outcomes.append(("full", full.queue, full.limit))
                else:
                    outcomes.append("stored")
        return outcomes

    local = await steps(lambda: dc_a.bus.queue("capped-here"))
    # A new federated handle per attach, as the local steps take a new queue handle.
    remote = await steps(lambda: dc_b.federate("capped-there", dc_a.url))
    assert local == [
        "stored",
        ("full", "capped-here", 1),
        ("full", "capped-here", 1),
        "stored",
        "stored",
        "stored",
    ]
    assert remote == [o if o == "stored" else ("full", "capped-there", 1) for o in local]
    assert await dc_a.bus.queue("capped-there").count() == 4


async def test_a_closed_federated_queue_stops_renewing_its_lease(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.queue("renewed"), dc_a.url)
    assert await remote.link.wait_usable(10)
    await remote.attach(ttl=60)

    def renewing() -> bool:
        name = "busmq-federated-renewal renewed"
        return any(t.get_name() == name and not t.done() for t in asyncio.all_tasks())

    assert renewing()
    await remote.close()
    # It ends with the queue, not at its next renewal (a third of the lease later).
    await eventually(lambda: not renewing(), timeout=1, what="the renewal ended")


def test_federated_queues_attached_together_renew_out_of_step() -> None:
    # The first pause is drawn from the interval's second half; the rest are the interval.
    firsts = []
    for _ in range(200):
        waits = renewal_waits(lambda: 5.0)
        firsts.append(next(waits))
        assert [next(waits) for _ in range(3)] == [5.0, 5.0, 5.0]
    assert all(2.5 <= first <= 5.0 for first in firsts)
    assert min(firsts) < 3.0 and max(firsts) > 4.5  # spread, not one instant
