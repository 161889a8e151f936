"""Queue names and the Redis keys a queue owns.

Every key of one queue carries the queue name as a ``{hash tag}``, so all of them
land in the same Redis Cluster slot and every multi-key script or transaction on a
queue is single-slot. The allowed name characters exclude braces for that reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from .errors import InvalidNameError

MAX_NAME_LENGTH = 200
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/-]*")
PREFIX = "busmq"


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid queue name, else raise :class:`InvalidNameError`.

    A name is 1-200 characters: ASCII letters, digits and ``_ . : @ / -``, starting
    with a letter or digit.
    """
    if not isinstance(name, str):
        raise InvalidNameError(repr(name), "must be a string")
    if not name:
        raise InvalidNameError(name, "must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(name[:40] + "...", f"longer than {MAX_NAME_LENGTH} characters")
    if not _NAME.fullmatch(name):
        raise InvalidNameError(
            name, "use ASCII letters, digits and _ . : @ / - (starting with a letter or digit)"
        )
    return name


DEAD_SUFFIX = ":dead"
"""Queue ``<name>:dead`` holds ``<name>``'s dead letters (see :mod:`busmq.controls`)."""


def dead_letter_name(name: str) -> str:
    """The name of ``name``'s dead-letter queue."""
    return name + DEAD_SUFFIX


def producer_epoch_key(producer: str) -> str:
    """The counter of a producer's epochs (see :meth:`busmq.Bus.producer`): one small
    key per producer name, kept without expiry so that epochs only grow."""
    return f"{PREFIX}:producer:{{{validate_name(producer)}}}:epoch"


def placement_name(name: str) -> str:
    """The name whose hash places the queue: a dead-letter queue goes with its queue, so
    moving a message between them is one single-slot script."""
    return name[: -len(DEAD_SUFFIX)] if name.endswith(DEAD_SUFFIX) else name


@dataclass(frozen=True)
class QueueKeys:
    """The Redis keys of one queue.

    - ``stream``: the messages, a Redis stream whose entry ids are ``<id>-0``.
    - ``info``: a hash with the id counter (``seq``), the mode, ttl, limits and the
      processing controls (pause, rate limits, max deliveries).
    - ``meta``: user metadata (``Queue.metadata``).
    - ``leases``: sorted set of attachments, scored by lease expiry (ms).
    - ``due``: sorted set of what waits for a time, scored by due time (ms): ``p:<id>``
      a delayed push (held in ``delayed``), ``r:<stream id>`` a retry.
    - ``delayed``: hash id -> delayed message (MessagePack), until it is due.
    - ``alias``: hash id -> stream id, for delayed messages stored after later ones.
    - ``state``: hash of what a retry or a dead letter needs: ``<stream id>`` -> the
      delivery count, ``f:``/``e:<stream id>`` -> first delivery (ms) / last error.
    - ``buckets``: hash header value -> token bucket, for the per-key rate limit.
    - ``parked``: sorted set of the stream ids waiting in ``due`` for a retry, scored by
      position: they left the pending list, and must not be collected as consumed.
    - ``outbox``: stream of the messages forwarded from this queue to a queue on
      another server (see :mod:`busmq.forwarding`), until they are stored there.
    - ``held`` and ``blocked``: the ordering per key (see :mod:`busmq.ordering`): which
      delivery holds each key, and the messages waiting for their key.

    A dead-letter queue (``<name>:dead``) has the same hash tag as its queue.
    """

    name: str
    # Names are computed once per QueueKeys (a queue keeps one): a push or a read takes
    # several, each an f-string over the hash tag.

    @cached_property
    def tag(self) -> str:
        base = placement_name(self.name)
        return f"{PREFIX}:{{{base}}}" + self.name[len(base) :]

    @cached_property
    def stream(self) -> str:
        return f"{self.tag}:s"

    @cached_property
    def info(self) -> str:
        return f"{self.tag}:i"

    @cached_property
    def meta(self) -> str:
        return f"{self.tag}:m"

    @cached_property
    def leases(self) -> str:
        return f"{self.tag}:l"

    @cached_property
    def dedupe_prefix(self) -> str:
        """Prefix of the per-``request_id`` keys that make pushes idempotent."""
        return f"{self.tag}:r:"

    @cached_property
    def notify_channel(self) -> str:
        """Pub/sub channel announcing new messages (see :mod:`busmq.notifier`)."""
        return f"{self.tag}:n"

    @cached_property
    def notify_channel_bytes(self) -> bytes:
        return self.notify_channel.encode()

    @cached_property
    def due(self) -> str:
        return f"{self.tag}:d"

    @cached_property
    def delayed(self) -> str:
        return f"{self.tag}:dm"

    @cached_property
    def alias(self) -> str:
        return f"{self.tag}:a"

    @cached_property
    def state(self) -> str:
        return f"{self.tag}:x"

    @cached_property
    def buckets(self) -> str:
        return f"{self.tag}:k"

    @cached_property
    def parked(self) -> str:
        return f"{self.tag}:w"

    @cached_property
    def outbox(self) -> str:
        return f"{self.tag}:o"

    @cached_property
    def held(self) -> str:
        return f"{self.tag}:g"

    @cached_property
    def blocked(self) -> str:
        return f"{self.tag}:gw"

    def all(self) -> tuple[str, ...]:
        """The keys that expire together and are deleted together on close, in the order
        the scripts expect them."""
        return self._all

    @cached_property
    def _all(self) -> tuple[str, ...]:
        return (
            self.info,
            self.stream,
            self.meta,
            self.leases,
            self.due,
            self.delayed,
            self.alias,
            self.state,
            self.buckets,
            self.parked,
            self.outbox,
            self.held,
            self.blocked,
        )

    @cached_property
    def ack_keys(self) -> tuple[str, ...]:
        """The KEYS of ``ack.lua`` and ``ack_upto.lua``."""
        return (
            self.stream,
            self.alias,
            self.state,
            self.due,
            self.parked,
            self.held,
            self.blocked,
            self.info,
        )

    def with_dead_letters(self) -> tuple[str, ...]:
        """:meth:`all`, then the dead-letter queue's keys: the KEYS of every script that
        may move a message to the dead letters."""
        return self._with_dead_letters

    @cached_property
    def _with_dead_letters(self) -> tuple[str, ...]:
        return self.all() + QueueKeys(dead_letter_name(self.name)).all()


CONSUMER_GROUP = "busmq"
