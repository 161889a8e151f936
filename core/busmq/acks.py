"""Acknowledgements issued in the same event-loop tick, sent as one batch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .errors import UnknownMessageError


class AckBatcher:
    """Coalesces acks issued in the same event-loop tick into one call of ``flush``,
    which returns the ids that were not pending (they fail with UnknownMessageError)."""

    def __init__(self, queue: str, flush: Callable[[list[int]], Awaitable[list[int]]]) -> None:
        self._queue = queue
        self._flush_fn = flush
        self._waiting: dict[int, list[asyncio.Future[None]]] = {}
        self._sending: dict[int, list[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None

    def __contains__(self, message_id: int) -> bool:
        """Whether an ack of ``message_id`` is waiting or on its way."""
        return message_id in self._waiting or message_id in self._sending

    async def ack(self, message_id: int) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(message_id, []).append(future)
        if self._task is None:
            self._task = asyncio.create_task(self._flush())
        await future

    async def drain(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let acks made in this tick join the batch
        waiting, self._waiting = self._waiting, {}
        self._task = None
        self._sending = waiting
        try:
            unknown = set(await self._flush_fn(list(waiting)))
        except BaseException as exc:
            self._sending = {}
            for futures in waiting.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            return
        self._sending = {}
        for message_id, futures in waiting.items():
            for future in futures:
                if future.done():
                    continue
                if message_id in unknown:
                    future.set_exception(UnknownMessageError(self._queue, [message_id]))
                else:
                    future.set_result(None)
