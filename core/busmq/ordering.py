"""Ordering per key: a queue's messages that share a key (the value of one header) are
handed out one at a time, in push order, across every consumer in every process, while
messages of different keys go out in parallel.

``await queue.set_ordering("customer")`` turns it on. From then on, at most one delivery
per key is in flight: the next message of a key goes out only after the previous one is
settled (acked, rejected, dead-lettered or expired). A ``nack()`` or a lapsed visibility
timeout keeps the key: that same message comes back before any later one of its key. A
message pushed with a delay holds its key's place until it is due and settled. Messages
without the header are not ordered and never wait. No partition count is chosen up front
and nothing rebalances: a key is held by a delivery, not by a consumer.

The state lives beside the queue's stream, changed only by the queue's Lua scripts, so
it holds across consumer crashes and Redis restarts (AOF), on a cluster (one hash tag)
and for a consumer in another datacenter reading through a gateway; across a failover,
see "Failover" under "Ordering per key" in docs/design.md:

- ``held`` (a hash): for each key with a delivery in flight, the stream entry holding it.
- ``blocked`` (a sorted set, all scores 0, so sorted by member): the entries waiting for
  their key, the member being the key (length-prefixed) then the padded entry id. The
  read script that meets a message whose key is held moves it there (out of the pending
  list) in O(log n); the settle of the holder moves the key's first waiting entry to the
  queue's ``due`` set, so that the next read of any consumer hands it out ahead of new
  messages. A blocked key never costs a read more than the one move of each message.

Ordering needs settlements: it is refused on a replay queue, and an ordered queue
refuses at-most-once and replay consumers (:class:`~busmq.errors.OrderingError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queue_store import QueueStore

MAX_KEY_BYTES = 1024
"""The longest ordering key (the header's value, UTF-8): a push of a longer one to an
ordered queue is refused whole (push_lib.lua)."""


@dataclass(frozen=True)
class OrderingState:
    """How far a queue's ordering per key is backed up, read in one step."""

    keys_in_flight: int
    """Keys with a delivery in flight (or handed its turn and about to go out)."""
    waiting: int
    """Messages waiting for their key."""
    oldest_waiting_age: float | None
    """Seconds since the oldest waiting message was pushed (``None``: none waits)."""


def validate_header(header: str) -> str:
    """``header`` if it can name an ordering key's header, else ``ValueError``."""
    if not isinstance(header, str) or not header or " " in header or len(header) > 200:
        raise ValueError("the ordering key is a header name: 1-200 characters, no spaces")
    return header


async def set_ordering(queue: QueueStore, header: str | None) -> None:
    """Order ``queue`` per the value of ``header`` (validated: :func:`validate_header`;
    ``None``: stop ordering, what waits goes out at once, in stream order)."""
    await queue.script("order", list(queue.keys.all()), ["" if header is None else header])


async def read_state(queue: QueueStore) -> OrderingState:
    held, waiting, age_ms = await queue.script("order_stats", list(queue.keys.all()), [])
    return OrderingState(
        keys_in_flight=int(held),
        waiting=int(waiting),
        oldest_waiting_age=None if int(age_ms) < 0 else int(age_ms) / 1000,
    )
