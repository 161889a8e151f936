"""One trace across datacenters and a cut link: a push in DC-B to a federated queue
waits in the outbox while the link is down, and its consumer in DC-A handles it in a
span that is a child of the push's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from busmq import Bus, Delivery, Mode
from busmq.federation import FederationSettings, FederationTarget
from tests.conftest import fast_settings
from tests.federation.conftest import FAST_LINK, SECRET, DatacenterA
from tests.support.redis_server import RedisServer
from tests.support.spans import named, parent_of
from tests.support.waiting import eventually


async def test_a_trace_spans_the_outbox_and_the_gateway(
    dc_a: DatacenterA, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with (
        RedisServer(tmp_path / "b-redis") as b_redis,
        Bus(fast_settings([b_redis.url], tracing=True)) as dc_b,
        Bus(fast_settings([dc_a.redis.url], tracing=True)) as a_traced,
    ):
        dc_b.configure_federation(
            FederationSettings(
                targets=[FederationTarget(dc_a.url, secret=SECRET)],
                outbox_path=tmp_path / "outbox.sqlite3",
                **FAST_LINK,
            )
        )
        local = a_traced.queue("shipments")
        await local.attach(ttl=120)
        remote = dc_b.federate("shipments", dc_a.url)
        await dc_a.proxy.cut()
        with trace.get_tracer("app").start_as_current_span("ship") as app:
            assert await remote.push({"parcel": 7}) is None  # in the outbox
        await dc_a.proxy.restore()
        await eventually(lambda: remote.outbox_depth == 0, what="outbox drained")
        got: list[Delivery] = []
        consumer = local.consume(Mode.AT_LEAST_ONCE)

        async def handle(delivery: Delivery) -> None:
            got.append(delivery)
            consumer.stop()

        await asyncio.wait_for(consumer.run(handle), 10)
    assert got[0].data == {"parcel": 7}
    [send] = named(spans, "send shipments")
    [process] = named(spans, "process shipments")
    assert parent_of(send) == app.get_span_context().span_id
    assert parent_of(process) == send.context.span_id
    assert process.context.trace_id == app.get_span_context().trace_id
