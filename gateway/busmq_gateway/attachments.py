"""Attachments held by the gateway on behalf of remote clients.

A remote attachment is a core attachment whose lease the *client* renews (the bus does
not renew it): a client that disappears stops renewing, its lease lapses in Redis, and
the sweeper drops the handle here. Attachment ids are unguessable, so one client cannot
renew or release another's.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass

from busmq import Bus, BusError, Queue, Retention

from .errors import NotFound
from .throttle import ThrottledLog

log = logging.getLogger(__name__)
_throttled = ThrottledLog(log)


@dataclass
class _Attachment:
    queue: Queue
    expires_at: float


class Attachments:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._items: dict[str, _Attachment] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def lease_seconds(self) -> float:
        return self._bus.settings.lease_seconds

    def __len__(self) -> int:
        return len(self._items)

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="busmq-gateway-sweeper")

    async def attach(
        self, name: str, ttl: float | None, retention: Retention | None, max_backlog: int | None
    ) -> tuple[str, bool]:
        queue = self._bus.queue(name)
        created = await queue.attach(
            ttl=ttl, retention=retention, max_backlog=max_backlog, auto_renew=False
        )
        attachment_id = secrets.token_urlsafe(18)
        self._items[attachment_id] = _Attachment(queue, self._deadline())
        return attachment_id, created

    async def renew(self, attachment_id: str) -> None:
        item = self._get(attachment_id)
        if not await item.queue.renew():
            self._items.pop(attachment_id, None)
            raise NotFound(
                f"queue {item.queue.name!r} no longer exists",
                "QUEUE_NOT_FOUND",
                {"queue": item.queue.name},
            )
        item.expires_at = self._deadline()

    async def detach(self, attachment_id: str) -> None:
        item = self._items.pop(attachment_id, None)
        if item is None:
            raise NotFound("unknown or expired attachment", "ATTACHMENT_NOT_FOUND")
        await item.queue.detach()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        items, self._items = self._items, {}
        for item in items.values():
            try:
                await item.queue.detach()
            except BusError as exc:
                log.warning("could not release attachment of %s: %s", item.queue.name, exc)

    def _get(self, attachment_id: str) -> _Attachment:
        item = self._items.get(attachment_id)
        if item is None or item.expires_at < asyncio.get_running_loop().time():
            raise NotFound("unknown or expired attachment", "ATTACHMENT_NOT_FOUND")
        return item

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.lease_seconds

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            now = asyncio.get_running_loop().time()
            lapsed = [key for key, item in self._items.items() if item.expires_at < now]
            for key in lapsed:
                item = self._items.pop(key)
                _throttled.log(
                    "lapsed",
                    logging.INFO,
                    "attachment to %s lapsed (client stopped renewing)",
                    item.queue.name,
                )
                try:
                    await item.queue.detach()
                except BusError as exc:
                    _throttled.log(
                        "release", logging.WARNING, "could not release a lapsed attachment: %s", exc
                    )
