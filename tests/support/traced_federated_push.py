"""A traced push from another datacenter, through a cut link, for the clients' trace tests.

    python -m tests.support.traced_federated_push GATEWAY_ADDRESS SECRET QUEUE [QUEUE ...]

Runs "datacenter B": its own redis-server and a traced bus that federates ``QUEUE`` of
the gateway at ``GATEWAY_ADDRESS`` (host:port) through a TCP proxy. It cuts the proxy,
pushes one message per queue under an application span ``ship`` (the pushes wait in the
outbox), restores the link and waits until the outbox has forwarded them. It prints one
JSON line: the trace id, the ``ship`` span's id, each queue's ``send`` span id, and how
many pushes the outbox held during the cut. A Go or TypeScript consumer of those queues
then checks that its handling span is in that trace, a child of the push's span.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

from busmq import Bus, BusSettings
from busmq.federation import FederationSettings, FederationTarget
from tests.support.redis_server import RedisServer
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually


async def main(address: str, secret: str, queues: list[str]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    host, port = address.rsplit(":", 1)
    settings = BusSettings(redis_urls=(), tracing=True)
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            RedisServer(Path(tmp) / "redis") as redis,
            TcpProxy(int(port), host) as proxy,
            Bus(replace(settings, redis_urls=(redis.url,)), tracer_provider=provider) as bus,
        ):
            bus.configure_federation(
                FederationSettings(
                    targets=[FederationTarget(proxy.url, secret=secret)],
                    outbox_path=Path(tmp) / "outbox.sqlite3",
                    reconnect_backoff_initial=0.05,
                    reconnect_backoff_max=0.5,
                    connect_timeout=1.0,
                )
            )
            remotes = [bus.federate(name, proxy.url) for name in queues]
            await proxy.cut()
            with provider.get_tracer("app").start_as_current_span("ship") as ship:
                for remote in remotes:
                    if await remote.push({"parcel": remote.name}) is not None:
                        raise SystemExit("the push went through a cut link")
            held = sum(remote.outbox_depth for remote in remotes)
            await proxy.restore()
            await eventually(
                lambda: all(r.outbox_depth == 0 for r in remotes), timeout=30, what="outbox drained"
            )
    spans = {span.name: span for span in exporter.get_finished_spans()}
    context = ship.get_span_context()
    result = {
        "trace_id": f"{context.trace_id:032x}",
        "ship_span_id": f"{context.span_id:016x}",
        "send_span_ids": {
            name: f"{_span_id(spans[f'send {name}'].get_span_context())}" for name in queues
        },
        "outbox_held": held,
    }
    print(json.dumps(result), flush=True)


def _span_id(context: SpanContext | None) -> str:
    assert context is not None
    return f"{context.span_id:016x}"


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
