"""OpenTelemetry propagation: a traced push writes its context into the message's
headers and records a PRODUCER span; handling the message records a CONSUMER span whose
parent is that producer span, for queues, service requests and channels."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from busmq import Bus, BusSettings, Delivery, MessageTooLargeError, Mode, Request
from busmq.channel import Channel
from tests.support.redis_server import RedisServer
from tests.support.spans import named, parent_of
from tests.support.waiting import eventually


@pytest.fixture
async def traced(redis_server: RedisServer, make_bus: Callable[..., Any]) -> Bus:
    bus: Bus = await make_bus([redis_server.url], tracing=True)
    return bus


async def _handled(queue: Any, count: int) -> list[Delivery]:
    got: list[Delivery] = []
    done = asyncio.Event()

    async def handle(delivery: Delivery) -> None:
        got.append(delivery)
        if len(got) == count:
            done.set()

    consumer = queue.consume(Mode.AT_LEAST_ONCE)
    running = asyncio.create_task(consumer.run(handle))
    await asyncio.wait_for(done.wait(), 10)
    consumer.stop()
    await running
    return got


async def test_a_handled_message_is_a_child_of_its_push(
    traced: Bus, spans: InMemorySpanExporter
) -> None:
    async with traced.queue("traced") as queue:
        tracer = trace.get_tracer("app")
        with tracer.start_as_current_span("checkout") as app:
            message_id = await queue.push({"order": 1}, headers={"tenant": "a"})
        [delivery] = await _handled(queue, 1)
    assert delivery.headers["tenant"] == "a"
    trace_id = f"{app.get_span_context().trace_id:032x}"
    assert delivery.headers["traceparent"].split("-")[1] == trace_id
    [send] = named(spans, "send traced")
    [process] = named(spans, "process traced")
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert parent_of(send) == app.get_span_context().span_id
    assert parent_of(process) == send.context.span_id
    assert process.context.trace_id == app.get_span_context().trace_id
    assert send.attributes is not None and process.attributes is not None
    assert send.attributes["messaging.system"] == "busmq"
    assert send.attributes["messaging.destination.name"] == "traced"
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.message.id"] == str(message_id)
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.message.id"] == str(message_id)


async def test_a_batch_is_one_producer_span_and_each_message_carries_it(
    traced: Bus, spans: InMemorySpanExporter
) -> None:
    async with traced.queue("traced-batch") as queue:
        await queue.push_batch([b"a", ("b", {"k": "v"}), {"c": 3}])
        handled = await _handled(queue, 3)
    [send] = named(spans, "send traced-batch")
    assert send.attributes is not None
    assert send.attributes["messaging.batch.message_count"] == 3
    parents = {d.headers["traceparent"].split("-")[2] for d in handled}
    assert parents == {f"{send.context.span_id:016x}"}
    assert [d.data for d in handled] == [b"a", "b", {"c": 3}]
    assert len(named(spans, "process traced-batch")) == 3


async def test_a_service_handler_is_a_child_of_the_requester(
    traced: Bus, spans: InMemorySpanExporter
) -> None:
    async def price(request: Request) -> Any:
        return {"price": 9.5, "traced": "traceparent" in request.message.headers}

    async with traced.service("pricing") as pricing:
        serving = asyncio.create_task(pricing.serve(price))
        with trace.get_tracer("app").start_as_current_span("quote") as app:
            reply = await pricing.request({"sku": "x"})
        pricing.stop_serving()
        await serving
    assert reply == {"price": 9.5, "traced": True}
    [handler] = named(spans, "process pricing")
    assert handler.context.trace_id == app.get_span_context().trace_id
    assert parent_of(handler) == app.get_span_context().span_id


async def test_a_channel_handler_is_a_child_of_the_send(
    traced: Bus, spans: InMemorySpanExporter
) -> None:
    sender, receiver = Channel(traced, "traced-chat"), Channel(traced, "traced-chat")
    got: list[Delivery] = []

    async def handle(delivery: Delivery) -> None:
        got.append(delivery)

    await receiver.listen(handler=handle)
    await sender.connect()
    await sender.send("hello")
    await eventually(lambda: len(got) == 1, what="the message handled")
    await asyncio.gather(sender.disconnect(), receiver.disconnect())
    [handled] = named(spans, "process traced-chat")
    sends = [s for s in spans.get_finished_spans() if s.name.startswith("send ")]
    assert parent_of(handled) in {s.context.span_id for s in sends}


async def test_with_tracing_off_nothing_is_recorded_or_written(
    bus: Bus, spans: InMemorySpanExporter
) -> None:
    async with bus.queue("untraced") as queue:
        with trace.get_tracer("app").start_as_current_span("app"):
            await queue.push("m")
        [delivery] = await _handled(queue, 1)
    assert "traceparent" not in delivery.headers
    assert [s.name for s in spans.get_finished_spans()] == ["app"]


def test_tracing_is_read_from_the_environment() -> None:
    assert BusSettings.from_env({"BUSMQ_TRACING": "true"}).tracing
    assert not BusSettings.from_env({"BUSMQ_TRACING": "0"}).tracing
    assert not BusSettings.from_env({}).tracing
    with pytest.raises(ValueError, match="BUSMQ_TRACING"):
        BusSettings.from_env({"BUSMQ_TRACING": "sometimes"})


async def test_the_messages_of_a_traced_batch_carry_its_context_each_in_its_own_headers(
    redis_server: RedisServer, make_bus: Callable[..., Any], spans: InMemorySpanExporter
) -> None:
    bus: Bus = await make_bus([redis_server.url], tracing=True, max_message_bytes=300)
    async with bus.queue("traced-batch") as queue:
        with trace.get_tracer("app").start_as_current_span("bulk"):
            await queue.push_batch(["a", b"b", {"c": 3}, ("d", {"tenant": "t"})])
            with pytest.raises(MessageTooLargeError):  # the trace headers count too
                await queue.push_batch(["x" * 250])
        got = [m async for m in queue.browse()]
    assert [m.data for m in got] == ["a", b"b", {"c": 3}, "d"]
    assert len({m.headers["traceparent"] for m in got}) == 1
    assert got[3].headers["tenant"] == "t"
    got[0].headers["traceparent"] = "changed"  # type: ignore[index]
    assert got[1].headers["traceparent"] != "changed"  # decoded headers are not shared
