"""A request handler process for tests/core/test_service.py.

``python -m tests.support.service_worker <urls-json> <service> [traced]`` serves until
terminated and prints ``{"event": "serving", "pid": ...}`` once it takes requests.
With ``traced``, tracing is on (OpenTelemetry's SDK records the spans). Requests are
``{"op": ..., ...}``:

- ``trace``: replies the handler span's trace id, span id and parent span id (hex);
- ``double``: replies ``{"n": n, "double": 2 n, "pid": pid}`` after a short pause;
- ``count``: streams ``0 .. to - 1`` then ends;
- ``stall-once``: on first delivery prints ``{"event": "stalling"}`` and never
  answers (the test kills the process); on redelivery replies with the delivery count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from busmq import Bus
from busmq.events import Event
from busmq.service import Request, Service
from tests.support.processes import emit, helper_settings


async def double(request: Request) -> dict[str, Any]:
    await asyncio.sleep(0.002)  # the handler's own time
    n = request.data["n"]
    return {"n": n, "double": 2 * n, "pid": os.getpid()}


async def count(request: Request) -> AsyncIterator[int]:
    for i in range(request.data["to"]):
        yield i


async def stall_once(request: Request) -> dict[str, Any]:
    if not request.redelivered:
        emit(event="stalling")
        await asyncio.Event().wait()
    return {"delivery_count": request.delivery_count, "pid": os.getpid()}


async def span_ids(request: Request) -> dict[str, str]:
    from opentelemetry import trace

    span = trace.get_current_span()
    parent = getattr(span, "parent", None)
    return {
        "trace_id": f"{span.get_span_context().trace_id:032x}",
        "span_id": f"{span.get_span_context().span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else "",
    }


def handler(request: Request) -> Any:
    op = request.data["op"]
    if op == "trace":
        return span_ids(request)
    if op == "count":
        return count(request)
    return stall_once(request) if op == "stall-once" else double(request)


async def main() -> None:
    urls, name = json.loads(sys.argv[1]), sys.argv[2]
    settings = helper_settings(urls)
    provider = None
    if sys.argv[3:] == ["traced"]:
        from opentelemetry.sdk.trace import TracerProvider

        settings, provider = dataclasses.replace(settings, tracing=True), TracerProvider()
    bus = Bus(settings, tracer_provider=provider)
    async with bus, Service(bus, name) as service:

        def report(event: Event) -> None:
            if event.kind == "serving":
                emit(event="serving", pid=os.getpid())

        service.events.on(report)
        await service.serve(handler, concurrency=8, visibility_timeout=2.0)


if __name__ == "__main__":
    asyncio.run(main())
