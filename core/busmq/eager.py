"""Tasks whose first step runs at once.

A task made with ``asyncio.create_task`` first runs on the event loop's next turn,
behind whatever else is ready then. Where a task's first step is a write (a push onto a
Redis connection, a message onto a gRPC stream), an eager task (Python 3.12+) makes it
in the caller's own turn, and a caller that needs nothing from the task pays no turn
for it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def start_eagerly(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
    """A task for ``coro`` that runs up to its first suspension now (Python 3.12+; a
    plain task on 3.11, which lacks eager tasks)."""
    if sys.version_info >= (3, 12):
        return asyncio.eager_task_factory(asyncio.get_running_loop(), coro, name=name)
    return asyncio.create_task(coro, name=name)  # pragma: no cover - the 3.11 floor
