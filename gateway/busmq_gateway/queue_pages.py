"""The dashboard's queue page: a queue's controls and charts, its stored messages and
dead letters, and the actions an operator takes on it (pause, resume, rate limit,
requeue or purge dead letters).

Reading a queue's figures needs what the rest of the dashboard needs. Reading its
messages and taking an action needs more, even on a loopback listener: the secret of a
principal with the ``admin`` grant on that queue (``Authorization: Bearer <secret>``,
or basic auth's password), unless the gateway serves without auth. Every action is
logged (logger ``busmq_gateway.dashboard``) with the principal's name, the client's
address and what changed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from busmq import Bus, InvalidNameError, Queue, QueueNotFoundError, RateLimit, queue_schema
from busmq.cli.records import to_record
from busmq.inventory import browse_pages
from busmq.keys import dead_letter_name, validate_name
from busmq.schemas import describe

from .access import ANONYMOUS, Access
from .history import History
from .principals import Kind, Principal, Verb

log = logging.getLogger("busmq_gateway.dashboard")

MAX_PAGE = 200
Action = Callable[[web.Request, str, Principal], Awaitable[dict[str, Any]]]


class QueuePages:
    def __init__(
        self, bus: Bus, access: Access, history: History, presented: Callable[[str], bytes]
    ) -> None:
        self.bus = bus
        self.access = access
        self.history = history
        self._presented = presented

    def register(self, router: web.UrlDispatcher) -> None:
        # The queue's name is a query parameter: names may hold "/".
        router.add_get("/api/queue", self._info)
        router.add_get("/api/queue/messages", self._admin(self._messages, "browse"))
        router.add_get("/api/queue/dead", self._admin(self._dead, "browse dead"))
        router.add_post("/api/queue/pause", self._admin(self._pause, "pause"))
        router.add_post("/api/queue/resume", self._admin(self._resume, "resume"))
        router.add_post("/api/queue/rate-limit", self._admin(self._rate_limit, "set rate limit"))
        router.add_post("/api/queue/dead/requeue", self._admin(self._requeue, "requeue dead"))
        router.add_post("/api/queue/dead/purge", self._admin(self._purge, "purge dead"))

    async def _info(self, request: web.Request) -> web.Response:
        name = request.query.get("name", "")
        try:
            queue = self.bus.queue(name)
        except InvalidNameError as exc:
            return _error(400, str(exc))
        try:
            info = await queue.info()
        except QueueNotFoundError:
            return _error(404, f"no queue {name!r}")
        limit = info.rate_limit
        return web.json_response(
            {
                "name": name,
                "count": info.count,
                "pending": info.pending,
                "delayed": info.delayed,
                "dead_letters": info.dead_letters,
                "last_id": info.last_id,
                "ttl": info.ttl,
                "mode": info.mode,
                "paused": info.paused,
                "rate_limit": None
                if limit is None
                else {"limit": limit.limit, "per_seconds": limit.per_seconds},
                "max_deliveries": info.max_deliveries,
                "ordering": info.ordering,
                "ordering_state": None
                if info.ordering_state is None
                else dataclasses.asdict(info.ordering_state),
                "schema": await _schema(queue),
                "history_interval": self.history.interval,
                "history": self.history.queue(name),
            }
        )

    def _admin(self, action: Action, what: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            name = request.query.get("name", "")
            try:
                validate_name(name)
            except InvalidNameError as exc:
                return _error(400, str(exc))
            principal = self._caller(request)
            if principal is None:
                return _error(401, "an action needs the secret of a principal with admin")
            if not principal.may(Kind.QUEUE, Verb.ADMIN, name):
                log.warning(
                    "dashboard: %s on queue %r refused to principal %r from %s",
                    what, name, principal.name, request.remote,
                )  # fmt: skip
                return _error(403, f"principal {principal.name!r} may not administer {name!r}")
            try:
                result = await action(request, name, principal)
            except QueueNotFoundError as exc:
                return _error(404, str(exc))
            except (ValueError, TypeError, KeyError) as exc:
                return _error(400, f"bad request: {exc}")
            if request.method == "POST":
                log.info(
                    "dashboard: %s on queue %r by principal %r from %s: %s",
                    what, name, principal.name, request.remote, result,
                )  # fmt: skip
            return web.json_response(result)

        return handler

    def _caller(self, request: web.Request) -> Principal | None:
        presented = self._presented(request.headers.get("Authorization", ""))
        if presented:
            return self.access.for_secret(presented)
        return ANONYMOUS if self.access.open_access else None

    async def _messages(self, request: web.Request, name: str, _: Principal) -> dict[str, Any]:
        return await self._page(request, name)

    async def _dead(self, request: web.Request, name: str, _: Principal) -> dict[str, Any]:
        if not await self.bus.queue(name).exists():
            raise QueueNotFoundError(name)
        return await self._page(request, dead_letter_name(name), missing_is_empty=True)

    async def _page(
        self, request: web.Request, name: str, *, missing_is_empty: bool = False
    ) -> dict[str, Any]:
        from_id = int(request.query.get("from", "0"))
        limit = min(int(request.query.get("limit", "50")), MAX_PAGE)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        queue = self.bus.queue(name)
        if not await queue.exists():
            if missing_is_empty:
                return {"messages": [], "more": False}
            raise QueueNotFoundError(name)
        messages: list[dict[str, Any]] = []
        async for page in browse_pages(queue.store, from_id, None, page=limit + 1):
            messages.extend(to_record(m) for m in page)
            if len(messages) > limit:
                break
        return {"messages": messages[:limit], "more": len(messages) > limit}

    async def _pause(self, request: web.Request, name: str, _: Principal) -> dict[str, Any]:
        await self.bus.queue(name).pause()
        return {"paused": True}

    async def _resume(self, request: web.Request, name: str, _: Principal) -> dict[str, Any]:
        await self.bus.queue(name).resume()
        return {"paused": False}

    async def _rate_limit(self, request: web.Request, name: str, _: Principal) -> dict[str, Any]:
        body = await _json(request)
        limit = body.get("limit")
        if limit is None:
            await self.bus.queue(name).set_rate_limit(None)
            return {"rate_limit": None}
        rate = RateLimit(int(limit), float(body.get("per_seconds", 1.0)))
        await self.bus.queue(name).set_rate_limit(rate)
        return {"rate_limit": {"limit": rate.limit, "per_seconds": rate.per_seconds}}

    async def _requeue(self, request: web.Request, name: str, _: Principal) -> dict[str, Any]:
        body = await _json(request)
        ids = body.get("ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            raise ValueError("ids must be a list of message ids")
        new_ids = await self.bus.queue(name).requeue_dead(ids, limit=int(body.get("limit", 0)))
        return {"requeued": len(new_ids), "ids": new_ids}

    async def _purge(self, request: web.Request, name: str, _: Principal) -> dict[str, Any]:
        if not await self.bus.queue(name).exists():
            raise QueueNotFoundError(name)
        dead = self.bus.queue(dead_letter_name(name))
        purged = (await dead.info()).count if await dead.exists() else 0
        if purged:
            await dead.flush()
        return {"purged": purged}


async def _json(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = json.loads(await request.read() or b"{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _schema(queue: Queue) -> dict[str, Any] | None:
    """The queue's schema for its page: the version enforced, how many there were, the
    mode and the document (``None``: pushes are not checked)."""
    current, mode, versions = await queue_schema.versions(queue.store)
    enforced = next((v for v in versions if v.version == current), None)
    if enforced is None:
        return None
    return {
        "version": enforced.version,
        "versions": len(versions),
        "compatibility": str(mode),
        "document": describe(enforced.schema),
    }
