"""Attachments held by the gateway on behalf of remote clients.

A remote attachment is a core attachment whose lease the *client* renews (the bus does
not renew it): a client that disappears stops renewing, its lease lapses in Redis, and
the sweeper drops the handle here. Attachment ids are unguessable, and bound to the
principal that attached: another principal holding one cannot renew or release it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from dataclasses import dataclass

from busmq import Bus, BusError, Queue, Retention

from .access import caller, check_owner
from .errors import NotFound
from .quotas import backlog_for, check_queue_quota
from .throttle import ThrottledLog

log = logging.getLogger(__name__)
_throttled = ThrottledLog(log)


@dataclass
class _Attachment:
    queue: Queue
    expires_at: float
    owner: str  # the principal that attached


class Attachments:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._items: dict[str, _Attachment] = {}
        self._held: dict[str, Counter[str]] = {}  # principal: its attachments by queue
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
        principal = caller()
        backlog = backlog_for(principal, max_backlog)
        queue = self._bus.queue(name)
        held = self._held.setdefault(principal.name, Counter())
        if name not in held:
            check_queue_quota(principal, len(held), name)
        held[name] += 1  # before the await: concurrent attaches see it
        try:
            created = await queue.attach(
                ttl=ttl, retention=retention, max_backlog=backlog, auto_renew=False
            )
        except BaseException:
            self._let_go(principal.name, name)
            raise
        attachment_id = secrets.token_urlsafe(18)
        self._items[attachment_id] = _Attachment(queue, self._deadline(), principal.name)
        return attachment_id, created

    async def renew(self, attachment_id: str) -> None:
        item = self._get(attachment_id)
        if not await item.queue.renew():
            self._drop(attachment_id)
            raise NotFound(
                f"queue {item.queue.name!r} no longer exists",
                "QUEUE_NOT_FOUND",
                {"queue": item.queue.name},
            )
        item.expires_at = self._deadline()

    async def detach(self, attachment_id: str) -> None:
        item = self._items.get(attachment_id)
        if item is None:
            raise NotFound("unknown or expired attachment", "ATTACHMENT_NOT_FOUND")
        check_owner(item.owner, "attachment_id")
        self._drop(attachment_id)
        await item.queue.detach()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        items, self._items = self._items, {}
        self._held.clear()
        for item in items.values():
            try:
                await item.queue.detach()
            except BusError as exc:
                log.warning("could not release attachment of %s: %s", item.queue.name, exc)

    def _get(self, attachment_id: str) -> _Attachment:
        item = self._items.get(attachment_id)
        if item is None or item.expires_at < asyncio.get_running_loop().time():
            raise NotFound("unknown or expired attachment", "ATTACHMENT_NOT_FOUND")
        check_owner(item.owner, "attachment_id")
        return item

    def _drop(self, attachment_id: str) -> _Attachment | None:
        item = self._items.pop(attachment_id, None)  # None: dropped meanwhile
        if item is not None:
            self._let_go(item.owner, item.queue.name)
        return item

    def _let_go(self, owner: str, queue: str) -> None:
        held = self._held[owner]
        held[queue] -= 1
        if held[queue] <= 0:
            del held[queue]
            if not held:
                del self._held[owner]

    def held_by(self, owner: str) -> int:
        """How many queues ``owner``'s attachments hold (its ``max_queues`` count)."""
        return len(self._held.get(owner, ()))

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.lease_seconds

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            now = asyncio.get_running_loop().time()
            lapsed = [key for key, item in self._items.items() if item.expires_at < now]
            for key in lapsed:
                item = self._drop(key)
                if item is None:
                    continue
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
