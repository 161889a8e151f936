"""Durability levels: when a push counts as acknowledged.

- ``async`` (the default): the master has applied it. A master that dies before its
  replicas (or its append-only file) caught up loses what it acknowledged last.
- ``replicas=N``: after the write, ``WAIT N timeout``; acknowledged only once N replicas
  have it, so a Sentinel failover to any of them keeps it.
- ``fsync``: the master's append-only file has it on disk: ``WAITAOF 1 0`` on Redis 7.2+,
  or nothing to wait for on a server that fsyncs every write (``appendonly yes`` with
  ``appendfsync always``); refused with a clear error anywhere else.
- ``fsync,replicas=N``: both.

A push that was applied but not confirmed as durable in time raises
:class:`~busmq.errors.DurabilityError`: it *may* be stored. Retry it with the same
``request_id``; the retry is deduped if the first one survived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Durability:
    """A durability level; build with :meth:`parse` or the class attributes."""

    replicas: int = 0
    fsync: bool = False

    ASYNC: ClassVar[Durability]  # set below the class
    FSYNC: ClassVar[Durability]

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or self.replicas < 0:
            raise ValueError(f"replicas must be a non-negative integer, got {self.replicas!r}")

    @property
    def is_async(self) -> bool:
        return not self.replicas and not self.fsync

    @classmethod
    def parse(cls, value: Durability | str) -> Durability:
        """``"async"``, ``"replicas=N"``, ``"fsync"`` or ``"fsync,replicas=N"``."""
        if isinstance(value, Durability):
            return value
        if not isinstance(value, str):
            raise ValueError(f"durability must be a string or a Durability, got {value!r}")
        replicas, fsync = 0, False
        for part in (p.strip().lower() for p in value.split(",")):
            if part == "async":
                continue
            if part == "fsync":
                fsync = True
            elif part.startswith("replicas="):
                count = part.removeprefix("replicas=")
                if not count.isdigit() or int(count) < 1:
                    raise ValueError(f"replicas=N needs a positive integer, got {value!r}")
                replicas = int(count)
            else:
                raise ValueError(
                    f"unknown durability {value!r}: use async, replicas=N, fsync or "
                    "fsync,replicas=N"
                )
        return cls(replicas, fsync)

    def __str__(self) -> str:
        parts = (["fsync"] if self.fsync else []) + (
            [f"replicas={self.replicas}"] if self.replicas else []
        )
        return ",".join(parts) or "async"


Durability.ASYNC = Durability()
Durability.FSYNC = Durability(fsync=True)
