"""Coalescing what concurrent callers submit in one event-loop tick into one call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class TickBatcher(Generic[T]):
    """Coalesces the items submitted in the same event-loop tick into one call of
    ``push`` (at most ``max_batch`` items each), so a burst of concurrent callers costs
    a few round trips; each caller waits for the call that carried its item."""

    def __init__(self, push: Callable[[list[T]], Awaitable[None]], max_batch: int) -> None:
        self._push = push
        self._max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def push(self, item: T) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._task is None:
            self._task = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        try:
            while self._waiting:
                await asyncio.sleep(0)  # let the items of this tick join the batch
                batch, self._waiting = (
                    self._waiting[: self._max_batch],
                    self._waiting[self._max_batch :],
                )
                try:
                    await self._push([item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for _, future in batch:
                        if not future.done():
                            future.set_result(None)
        finally:
            self._task = None
