"""Placement of names on shards: rendezvous (highest-random-weight) hashing.

Each name ranks every shard by a hash of (shard, name). A new queue goes to the
first-ranked shard; adding a shard only moves the names for which the new shard
ranks first (about 1/N of them). Existing queues are never stranded: the bus looks
for a queue on the shards in rank order and uses the first one that already holds
it (see :mod:`busmq.placement`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _weight(shard_id: str, name: str) -> int:
    digest = hashlib.blake2b(f"{shard_id}\x00{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(shard_ids: Sequence[str], name: str) -> list[int]:
    """Indexes of ``shard_ids`` ordered from most to least preferred for ``name``."""
    return sorted(
        range(len(shard_ids)), key=lambda i: (_weight(shard_ids[i], name), i), reverse=True
    )
