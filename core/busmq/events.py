"""Events in asyncio form: async iterators and callbacks over the same stream of events.

An emitter never blocks on a slow listener: each iterator has a bounded buffer, and
when it is full the oldest event is dropped and counted in ``Subscription.dropped``
(events describe state; messages never travel through here).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

E = TypeVar("E")
Callback = Callable[[E], Awaitable[None] | None]


@dataclass(frozen=True)
class Event:
    """Something that happened to a bus, queue or consumer.

    Attributes:
        kind: e.g. ``online``, ``offline``, ``error``, ``attached``, ``detached``,
            ``consuming``, ``stopped``.
        source: what it happened to (a shard URL with the password masked, a queue name).
        error: the exception, for ``error`` events.
        details: extra facts, e.g. ``{"mode": "at_least_once"}``.
    """

    kind: str
    source: str
    error: BaseException | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Subscription(Generic[E]):
    """An async iterator of events; leave it with ``close()`` or ``async with``."""

    def __init__(self, hub: EventHub[E], maxsize: int) -> None:
        self._hub = hub
        self._queue: asyncio.Queue[E | None] = asyncio.Queue(maxsize)
        self.dropped = 0

    def _offer(self, event: E) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[E]:
        return self

    async def __anext__(self) -> E:
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    def close(self) -> None:
        self._hub._subscriptions.discard(self)
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def __aenter__(self) -> Subscription[E]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class EventHub(Generic[E]):
    """Fan-out of events to subscriptions and callbacks."""

    def __init__(self) -> None:
        self._subscriptions: set[Subscription[E]] = set()
        self._callbacks: list[Callback[E]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def subscribe(self, maxsize: int = 1000) -> Subscription[E]:
        """Start receiving events from now on."""
        sub: Subscription[E] = Subscription(self, maxsize)
        self._subscriptions.add(sub)
        return sub

    def on(self, callback: Callback[E]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event (sync or async); returns an unsubscriber."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def emit(self, event: E) -> None:
        for sub in tuple(self._subscriptions):
            sub._offer(event)
        for callback in tuple(self._callbacks):
            try:
                result = callback(event)
            except Exception:
                log.exception("event callback failed")
                continue
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(self._await_callback(result))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _await_callback(result: Awaitable[None]) -> None:
        try:
            await result
        except Exception:
            log.exception("event callback failed")

    def close(self) -> None:
        for sub in tuple(self._subscriptions):
            sub.close()
        self._callbacks.clear()
