"""Placement: which shard holds a named object.

Below every object of the bus (queues, consumers, channels, services, persistables):
they ask it for their shard and never look further up. A bus of standalone or Sentinel
shards places names by rendezvous hashing (:mod:`busmq.sharding`); an object created
before shards were added is still found where it lives, because shards are probed in
rank order for its key and the first that holds it wins. What was found is remembered
until the object is reported gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import redis.asyncio as aioredis

from .errors import BusError
from .shard import Shard
from .sharding import rank


class Placement:
    """Rendezvous placement over a bus's shards, with a cache of known locations."""

    def __init__(self, shards: Sequence[Shard] = ()) -> None:
        self._shards = list(shards)
        self._identities = [s.identity for s in self._shards]
        self._known: dict[str, Shard] = {}  # probe key -> shard holding it

    @property
    def shards(self) -> list[Shard]:
        return list(self._shards)

    async def locate(self, name: str, probe_key: str) -> Shard:
        """The shard that holds ``name`` (whose existence ``probe_key`` shows), or where
        it is to be created."""
        shards = self._shards
        if not shards:
            raise BusError("the bus is not connected")
        if len(shards) == 1:
            return shards[0]
        known = self._known.get(probe_key)
        if known is not None:
            return known
        order = [shards[i] for i in rank(self._identities, name)]

        async def exists(client: aioredis.Redis) -> int:
            return int(await client.exists(probe_key))

        found = await asyncio.gather(*(s.run(exists, idempotent=True) for s in order))
        for shard, present in zip(order, found, strict=True):
            if present:
                self._known[probe_key] = shard
                return shard
        return order[0]

    def remember(self, probe_key: str, shard: Shard) -> None:
        """``probe_key``'s object now exists on ``shard``."""
        self._known[probe_key] = shard

    def forget(self, probe_key: str) -> None:
        """The object is gone from where it was: locate it afresh next time."""
        self._known.pop(probe_key, None)
