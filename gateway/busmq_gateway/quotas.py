"""Per-principal quotas on what its attachments create and keep alive (``max_queues``,
``max_backlog`` in the principals file). Past one, the call ends ``RESOURCE_EXHAUSTED``
with ``ErrorInfo`` naming the quota, logged and counted as a refusal.

``max_queues`` counts across the fleet: the queues a principal holds are kept in Redis
(:class:`HeldQueues`), one sorted set per principal with a quota, each attachment scored
by its lease's end, so that every gateway and worker sees the same count and an
attachment whose client stopped renewing stops counting when its lease lapses. A
principal without ``max_queues`` costs nothing here.
"""

from __future__ import annotations

import hashlib
from typing import Any

from redis.commands.core import AsyncScript

from busmq import Bus

from .access import LimitExceeded, refuse
from .principals import Principal

_SEPARATOR = "\x1f"

# KEYS: the principal's set. ARGV: entry (queue, separator, member), queue, limit, lease ms.
# Returns -1 once the entry is held, else how many queues the principal holds (refused).
_HOLD = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local queues, count, has = {}, 0, false
for _, entry in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local queue = string.match(entry, '^(.-)\031')
  if queue == ARGV[2] then has = true end
  if not queues[queue] then queues[queue] = true; count = count + 1 end
end
if not has and count >= tonumber(ARGV[3]) then return count end
local lease = tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return -1
"""

# KEYS: the principal's set. ARGV: entry, lease ms. Extends a held entry's lease.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return 0
"""


class HeldQueues:
    """The queues each principal with ``max_queues`` holds, fleet-wide, in Redis."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._scripts: dict[str, AsyncScript] = {}  # by source: run with EVALSHA

    async def hold(self, principal: Principal, queue: str, member: str) -> None:
        """Count ``member``'s attachment of ``queue`` for ``principal``, or refuse it
        ``RESOURCE_EXHAUSTED`` if that would make more queues than its quota."""
        limit = principal.max_queues
        if not limit:
            return
        args = (_entry(queue, member), queue, limit, self._lease_ms)
        held = await self._run(principal.name, self._script(_HOLD, args))
        if int(held) >= 0:
            check_queue_quota(principal, int(held), queue)

    async def renew(self, principal: Principal, queue: str, member: str) -> None:
        if principal.max_queues:
            args = (_entry(queue, member), self._lease_ms)
            await self._run(principal.name, self._script(_RENEW, args))

    async def release(self, principal: Principal, queue: str, member: str) -> None:
        if principal.max_queues:
            entry = _entry(queue, member)
            await self._run(principal.name, lambda c, key: c.zrem(key, entry))

    async def count(self, principal: Principal) -> int:
        """How many queues ``principal`` holds (its ``max_queues`` count)."""

        async def read(client: Any, key: str) -> set[str]:
            entries = await client.zrangebyscore(key, "(" + str(await _now_ms(client)), "+inf")
            return {_text(e).split(_SEPARATOR, 1)[0] for e in entries}

        return len(await self._run(principal.name, read))

    def _script(self, source: str, args: tuple[Any, ...]) -> Any:
        """A call of Lua ``source`` on the principal's key (EVALSHA, loaded on NOSCRIPT)."""

        async def call(client: Any, key: str) -> Any:
            script = self._scripts.get(source)
            if script is None:
                script = self._scripts[source] = client.register_script(source)
            return await script(keys=[key], args=list(args), client=client)

        return call

    @property
    def _lease_ms(self) -> int:
        return int(self._bus.settings.lease_seconds * 1000)

    async def _run(self, principal: str, call: Any) -> Any:
        key = held_key(principal)
        shard = await self._bus.placement.locate(f"gateway:held:{principal}", key)
        return await shard.run(lambda client: call(client, key), idempotent=True)


def held_key(principal: str) -> str:
    """The Redis key of what ``principal`` holds (its name hashed: names are free text)."""
    digest = hashlib.sha256(principal.encode()).hexdigest()[:24]
    return f"busmq:gateway:held:{{{digest}}}"


def _entry(queue: str, member: str) -> str:
    return f"{queue}{_SEPARATOR}{member}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def _now_ms(client: Any) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def backlog_for(principal: Principal, requested: int | None) -> int | None:
    """The ``max_backlog`` an attach by ``principal`` gives its queue: ``requested``
    (``None`` keeps the queue's, ``0`` removes it), within the principal's ceiling; a
    principal with a ceiling always sets a limit, the ceiling when it asked none."""
    ceiling = principal.max_backlog
    if not ceiling:
        return requested
    if requested is None:
        return ceiling
    if requested == 0 or requested > ceiling:
        asked = "no backlog limit" if requested == 0 else f"max_backlog {requested}"
        raise refuse(
            LimitExceeded(
                f"principal {principal.name!r} may not set {asked}: its quota is "
                f"max_backlog {ceiling}",
                "BACKLOG_QUOTA",
                {"principal": principal.name, "max_backlog": str(ceiling)},
            ),
            asked,
        )
    return requested


def check_queue_quota(principal: Principal, held: int, queue: str) -> None:
    """Refuse an attach that would have ``principal`` hold more than ``max_queues``
    queues (``held``: how many it holds now, ``queue`` not among them)."""
    limit = principal.max_queues
    if limit and held >= limit:
        raise refuse(
            LimitExceeded(
                f"principal {principal.name!r} holds {held} queues, its quota (max_queues): "
                "detach one first",
                "QUEUE_QUOTA",
                {"principal": principal.name, "max_queues": str(limit)},
            ),
            f"attach {queue!r} over max_queues {limit}",
        )
