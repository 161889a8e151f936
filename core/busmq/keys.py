"""Queue names and the Redis keys a queue owns.

Every key of one queue carries the queue name as a ``{hash tag}``, so all of them
land in the same Redis Cluster slot and every multi-key script or transaction on a
queue is single-slot. The allowed name characters exclude braces for that reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class QueueKeys:
    """The Redis keys of one queue.

    - ``stream``: the messages, a Redis stream whose entry ids are ``<id>-0``.
    - ``info``: a hash with the id counter (``seq``), the mode, ttl and limits.
    - ``meta``: user metadata (``Queue.metadata``).
    - ``leases``: sorted set of attachments, scored by lease expiry (ms).
    """

    name: str

    @property
    def tag(self) -> str:
        return f"{PREFIX}:{{{self.name}}}"

    @property
    def stream(self) -> str:
        return f"{self.tag}:s"

    @property
    def info(self) -> str:
        return f"{self.tag}:i"

    @property
    def meta(self) -> str:
        return f"{self.tag}:m"

    @property
    def leases(self) -> str:
        return f"{self.tag}:l"

    @property
    def dedupe_prefix(self) -> str:
        """Prefix of the per-``request_id`` keys that make pushes idempotent."""
        return f"{self.tag}:r:"

    @property
    def notify_channel(self) -> str:
        """Pub/sub channel announcing new messages (see :mod:`busmq.notifier`)."""
        return f"{self.tag}:n"

    def all(self) -> tuple[str, str, str, str]:
        """The keys that expire together and are deleted together on close, in the order
        the scripts expect them."""
        return (self.info, self.stream, self.meta, self.leases)


CONSUMER_GROUP = "busmq"
