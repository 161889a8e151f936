"""Attachments held by the gateway on behalf of remote clients.

A remote attachment is a core lease whose *client* renews it (:mod:`busmq.leases`): a
client that disappears stops renewing and its lease lapses in Redis. The gateway keeps
nothing of it in memory: the attachment id is signed (:mod:`busmq_gateway.fleet`) with
the principal that attached, the queue and the lease's member, so any gateway of the
fleet renews or releases it, and another principal holding the id cannot.
"""

from __future__ import annotations

import secrets

from busmq import Bus, Retention
from busmq.leases import Renewal, hold, release_held, renew_held

from .access import caller, check_owner
from .errors import NotFound
from .fleet import ATTACHMENT, FleetKey
from .quotas import HeldQueues, backlog_for


class Attachments:
    def __init__(self, bus: Bus, fleet: FleetKey) -> None:
        self._bus = bus
        self._fleet = fleet
        self.held = HeldQueues(bus)

    @property
    def lease_seconds(self) -> float:
        return self._bus.settings.lease_seconds

    async def attach(
        self, name: str, ttl: float | None, retention: Retention | None, max_backlog: int | None
    ) -> tuple[str, bool]:
        principal = caller()
        backlog = backlog_for(principal, max_backlog)
        store = self._bus.queue(name).store
        member = f"gw:{secrets.token_urlsafe(12)}"
        await self.held.hold(principal, name, member)
        try:
            created = await hold(store, member, ttl=ttl, retention=retention, max_backlog=backlog)
        except BaseException:
            await self.held.release(principal, name, member)
            raise
        return self._fleet.sign(ATTACHMENT, principal.name, name, member), created

    async def renew(self, attachment_id: str) -> None:
        name, member = self._open(attachment_id)
        renewal = await renew_held(self._bus.queue(name).store, member)
        if renewal is Renewal.QUEUE_GONE:
            await self.held.release(caller(), name, member)
            raise NotFound(f"queue {name!r} no longer exists", "QUEUE_NOT_FOUND", {"queue": name})
        if renewal is Renewal.LAPSED:
            await self.held.release(caller(), name, member)
            raise ATTACHMENT.not_found()
        await self.held.renew(caller(), name, member)

    async def detach(self, attachment_id: str) -> None:
        name, member = self._open(attachment_id)
        await release_held(self._bus.queue(name).store, member)
        await self.held.release(caller(), name, member)

    def _open(self, attachment_id: str) -> tuple[str, str]:
        owner, name, member = self._fleet.open(ATTACHMENT, attachment_id)
        check_owner(owner, "attachment_id")
        return name, member
