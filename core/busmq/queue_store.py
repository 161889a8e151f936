"""A queue's Redis side: its keys, its shard, and the calls that run there.

The queue objects (:class:`~busmq.queue.Queue`, :class:`~busmq.consumer.Consumer`) and the
modules that carry out their operations (:mod:`~busmq.pushing`, :mod:`~busmq.controls`,
:mod:`~busmq.inventory`, :mod:`~busmq.consumer_group`) reach Redis only through a
``QueueStore``, and none of them imports the queue object: the layers call down.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aioredis

from .errors import (
    BusClosedError,
    OrderingError,
    QueueFullError,
    QueueNotFoundError,
    RedisCommandError,
)
from .keys import QueueKeys, placement_name, validate_name
from .notifier import mark_give_back, mark_recheck

if TYPE_CHECKING:
    import asyncio

    from .context import BusContext
    from .mux import MuxClient
    from .shard import Shard

T = TypeVar("T")


class QueueStore:
    """One queue's keys on its shard, located on first use (and again once lost), and
    the wake-ups of this process's consumers of it."""

    __slots__ = ("bus", "keys", "name", "shard", "wakes")

    def __init__(self, bus: BusContext, name: str) -> None:
        self.name = validate_name(name)
        self.bus = bus
        self.keys = QueueKeys(self.name)
        self.shard: Shard | None = None
        self.wakes: set[asyncio.Event] = set()
        """The wake-ups of this process's consumers that are reading the queue."""

    async def run(self, call: Callable[[aioredis.Redis], Awaitable[T]], *, idempotent: bool) -> T:
        shard = await self.located()
        return await shard.run(call, idempotent=idempotent)

    async def run_fast(self, call: Callable[[MuxClient], Awaitable[T]], *, idempotent: bool) -> T:
        """:meth:`run` for the hot paths (see :meth:`Shard.run_fast`)."""
        shard = self.shard or await self.located()
        return await shard.run_fast(call, idempotent=idempotent, route=self.keys.stream)

    async def script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run Lua script ``name`` on the queue's shard; an error it raises (``NOQUEUE``,
        ``FULL``) becomes the typed error (see :meth:`script_error`)."""
        try:
            return await self.run(
                lambda c: self.bus.scripts.call(c, name, keys, args), idempotent=True
            )
        except RedisCommandError as exc:
            raise self.script_error(exc) from None

    async def located(self) -> Shard:
        """The queue's shard, located on first use (and again after it was lost)."""
        if self.shard is None:
            self.shard = await self.locate()
        return self.shard

    async def locate(self) -> Shard:
        return await self.bus.placement.locate(placement_name(self.name), self.keys.info)

    def forget(self) -> None:
        """The queue is gone: locate it afresh next time."""
        self.shard = None
        self.bus.placement.forget(self.keys.info)

    async def send_deferred(self) -> None:
        """Have Redis apply this process's deferred clean-ups of the queue (the ``XDEL``
        of an at-most-once read, see ``MuxClient.defer``) before a read that counts."""
        if self.shard is not None:
            await self.run_fast(lambda m: m.flush_deferred(), idempotent=True)

    def script_error(self, exc: RedisCommandError) -> Exception:
        text = str(exc)
        if text.startswith("NOQUEUE"):
            self.forget()
            return QueueNotFoundError(self.name)
        if text.startswith("FULL"):
            return QueueFullError(self.name, int(text.split()[1]))
        if text.startswith("ORDERED"):
            return OrderingError(self.name, text.removeprefix("ORDERED "))
        return exc

    def require_open(self) -> None:
        if self.bus.closed:
            raise BusClosedError("the bus is closed")

    async def exists(self) -> bool:
        return bool(await self.run(lambda c: c.exists(self.keys.info), idempotent=True))

    async def require_exists(self) -> None:
        if not await self.exists():
            raise QueueNotFoundError(self.name)

    def read_in_full(self) -> None:
        """Have this process's consumers of the queue make their next read the full one
        (see ``consumer._fetch``) now, rather than when the publication that tells every
        process so comes back: a retry parked here is due before what was stored after."""
        mark_recheck(self.wakes)

    def paused(self) -> None:
        """This process's consumers stop now, not when the publication comes back."""
        mark_give_back(self.wakes)

    async def ack(self, ids: list[int]) -> list[int]:
        """Acknowledge at-least-once deliveries by id; the ids that were not pending."""
        if not ids:
            return []
        keys = self.keys.ack_keys
        attempts = 0

        async def ack(mux: MuxClient) -> list[bytes]:
            nonlocal attempts
            attempts += 1
            unknown: list[bytes] = await self.bus.scripts.call(mux, "ack", keys, ids)
            return unknown

        # Safe to send again (through a failover): an id acked twice is acked once.
        unknown = await self.run_fast(ack, idempotent=True)
        if attempts > 1:  # an attempt whose reply was lost may have acked them
            unknown = []
        self.bus.counters.add("acked", self.name, len(ids) - len(unknown))
        return [int(u) for u in unknown]

    async def prepare_consumer(self, family: str, settles: bool) -> tuple[str, int]:
        """Fix the queue's consumption family (``prepare_consumer.lua``): the family in
        force and the last id stored. A consumer that does not settle its deliveries
        (``settles`` false: at-most-once, replay) is refused on a queue ordered per key."""
        mode, last_id = await self.script(
            "prepare_consumer",
            [self.keys.info, self.keys.stream],
            [family, "1" if settles else "0"],
        )
        family = mode.decode() if isinstance(mode, bytes) else str(mode)
        return family, int(last_id)
