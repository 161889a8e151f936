"""Serving a core service from the gateway: its ``serve()`` in a task, started."""

from __future__ import annotations

import asyncio
from typing import Any

from busmq import BusError, Service
from busmq.service import Handler


async def start_serving(
    service: Service, handler: Handler, name: str, **options: Any
) -> asyncio.Task[None]:
    """Run ``service.serve(handler, **options)`` in a task named ``name``; return the task
    once the service serves. ``serve()``'s error, if it fails to start, is raised."""
    serving = asyncio.Event()
    service.events.on(lambda event: serving.set() if event.kind == "serving" else None)
    task = asyncio.create_task(service.serve(handler, **options), name=name)
    started = asyncio.ensure_future(serving.wait())
    try:
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller was cancelled while the service started
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    finally:
        started.cancel()
    if task.done():
        task.result()
        raise BusError(f"service {service.name!r} stopped serving")
    return task
