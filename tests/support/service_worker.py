"""A request handler process for tests/core/test_service.py.

``python -m tests.support.service_worker <urls-json> <service>`` serves until
terminated and prints ``{"event": "serving", "pid": ...}`` once it takes requests.
Requests are ``{"op": ..., ...}``:

- ``double``: replies ``{"n": n, "double": 2 n, "pid": pid}`` after a short pause;
- ``count``: streams ``0 .. to - 1`` then ends;
- ``stall-once``: on first delivery prints ``{"event": "stalling"}`` and never
  answers (the test kills the process); on redelivery replies with the delivery count.
"""

from __future__ import annotations

import asyncio
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
    await asyncio.sleep(0.002)
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


def handler(request: Request) -> Any:
    op = request.data["op"]
    if op == "count":
        return count(request)
    return stall_once(request) if op == "stall-once" else double(request)


async def main() -> None:
    urls, name = json.loads(sys.argv[1]), sys.argv[2]
    async with Bus(helper_settings(urls)) as bus, Service(bus, name) as service:

        def report(event: Event) -> None:
            if event.kind == "serving":
                emit(event="serving", pid=os.getpid())

        service.events.on(report)
        await service.serve(handler, concurrency=8, visibility_timeout=2.0)


if __name__ == "__main__":
    asyncio.run(main())
