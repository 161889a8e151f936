"""The bounded buffer between a channel end's reader and its iteration, shared by local
and federated channel ends."""

from __future__ import annotations

import asyncio
import collections

from .message import Delivery


class Inbox:
    """The bounded buffer between the pump and the iteration. ``close()`` never blocks
    and lets the iteration drain what is left before it ends; once ``unbounded`` (set
    while a disconnect drains the consumer) puts never wait."""

    def __init__(self, maxsize: int) -> None:
        self._items: collections.deque[Delivery] = collections.deque()
        self._maxsize = maxsize
        self._closed = False
        self._unbounded = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    def _can_put(self) -> bool:
        return self._unbounded or self._closed or len(self._items) < self._maxsize

    def _update(self) -> None:
        for event, ready in (
            (self._readable, bool(self._items) or self._closed),
            (self._writable, self._can_put()),
        ):
            if ready:
                event.set()
            else:
                event.clear()

    async def put(self, item: Delivery) -> None:
        while not self._can_put():
            await self._writable.wait()
        self._items.append(item)
        self._update()

    async def get(self) -> Delivery | None:
        while not (self._items or self._closed):
            await self._readable.wait()
        if not self._items:
            return None
        item = self._items.popleft()
        self._update()
        return item

    def take_all(self) -> list[Delivery]:
        items = list(self._items)
        self._items.clear()
        self._update()
        return items

    def set_unbounded(self) -> None:
        self._unbounded = True
        self._update()

    def close(self) -> None:
        self._closed = True
        self._update()
