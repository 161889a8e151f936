"""A federating application's metrics (busmq.metrics served by prometheus_client's own
HTTP server): link state, outbox depth and age, lag and resumes through a cut."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from busmq import Bus, Mode, UnknownMessageError
from busmq.metrics import BusMetrics
from tests.federation.conftest import DatacenterA
from tests.support.cli import Result, busmq
from tests.support.redis_server import free_port
from tests.support.scrape import Samples, scrape
from tests.support.waiting import eventually


@pytest.fixture
def serve_metrics() -> Iterator[list[str]]:
    """Servers appended to the list are shut down after the test."""
    servers: list[object] = []
    yield servers  # type: ignore[misc]
    for server in servers:
        server.shutdown()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]


async def federation_status(url: str) -> Result:
    return await busmq("--json", "federation", "status", "--metrics", url, "--fail-if-down")


async def test_link_outbox_lag_and_resumes_through_a_cut(
    dc_a: DatacenterA, dc_b: Bus, serve_metrics: list[object]
) -> None:
    registry = CollectorRegistry()
    registry.register(BusMetrics(dc_b, cache_seconds=0))
    port = free_port()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    serve_metrics.append(server)
    url = f"http://127.0.0.1:{port}/metrics"
    link = {"target": dc_a.url}

    async def scraped() -> Samples:
        return await scrape(url)

    await dc_a.bus.queue("events").attach(ttl=60)
    queue = dc_b.federate("events", dc_a.url)
    assert await queue.link.wait_usable(10)
    for i in range(10):
        assert await queue.push(i) is not None
    async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=1) as consumer:
        first = await consumer.__anext__()
        await first.ack()
        samples = await scraped()
        assert samples["busmq_federation_link_up", link] == 1
        assert samples["busmq_federation_link_state", {**link, "state": "ready"}] == 1
        assert samples["busmq_federation_link_state", {**link, "state": "disconnected"}] == 0
        assert samples["busmq_federation_outbox_messages", link] == 0
        assert samples["busmq_federation_outbox_age_seconds", link] == 0
        assert samples["busmq_federation_lag_messages", link] == 9
        assert samples["busmq_federation_lag_seconds", link] > 0
        assert samples["busmq_federation_resumes_total", link] == 0

        await dc_a.proxy.cut()
        await eventually(lambda: not queue.link.usable, what="link down")
        for i in range(3):
            assert await queue.push(i) is None  # kept in the outbox
        samples = await scraped()
        assert samples["busmq_federation_link_up", link] == 0
        assert samples["busmq_federation_link_state", {**link, "state": "ready"}] == 0
        assert samples["busmq_federation_outbox_messages", link] == 3
        assert samples["busmq_federation_outbox_age_seconds", link] > 0
        # The admin CLI reads the same endpoint.
        down = await federation_status(url)
        assert down.code == 5  # --fail-if-down
        [row] = down.json()
        assert (row["target"], row["state"], row["up"], row["outbox"]) == (
            dc_a.url, "disconnected", 0, 3,
        )  # fmt: skip

        await dc_a.proxy.restore()
        await eventually(lambda: queue.link.outbox_depth == 0, timeout=20, what="outbox drained")
        # At least once: a delivery read before the cut may be handed out again after
        # it (its first ack is then refused); every id is acked once in the end.
        acked = {first.id}
        while len(acked) < 13:
            delivery = await consumer.__anext__()
            with contextlib.suppress(UnknownMessageError):
                await delivery.ack()
                acked.add(delivery.id)
        assert acked == set(range(1, 14))
        samples = await scraped()
        assert samples["busmq_federation_link_up", link] == 1
        assert samples["busmq_federation_outbox_messages", link] == 0
        assert samples["busmq_federation_lag_messages", link] == 0  # caught up
        assert samples["busmq_federation_resumes_total", link] >= 1
        up = await federation_status(url)
        assert up.code == 0
        [row] = up.json()
        assert (row["state"], row["outbox"], row["lag_messages"]) == ("ready", 0, 0)
    assert await dc_a.bus.queue("events").count() == 0
