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

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import redis.exceptions as rex

from .mux import MuxClient


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


@dataclass(frozen=True)
class FsyncSupport:
    """How a server confirms an fsync: ``WAITAOF`` (Redis 7.2+), or not at all because
    it fsyncs every write before answering; ``problem`` says why it can do neither."""

    waitaof: bool = False
    problem: str | None = None


async def fsync_support(mux: MuxClient) -> FsyncSupport:
    """Ask the server (``INFO``, ``CONFIG GET``) how it can confirm an fsync."""
    info = await mux.execute(b"INFO", b"server")
    found = re.search(rb"redis_version:([0-9.]+)", info)
    version = found.group(1).decode() if found else "?"
    if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) >= (7, 2):
        return FsyncSupport(waitaof=True)
    try:
        pairs = await mux.execute(b"CONFIG", b"GET", b"append*")
    except rex.ResponseError as exc:
        problem = f"Redis {version} has no WAITAOF and refuses CONFIG GET ({exc})"
        return FsyncSupport(problem=problem)
    config = {k.decode(): v.decode() for k, v in zip(pairs[::2], pairs[1::2], strict=True)}
    appendonly, appendfsync = config.get("appendonly"), config.get("appendfsync")
    if appendonly == "yes" and appendfsync == "always":
        return FsyncSupport()
    return FsyncSupport(
        problem=f"Redis {version} has no WAITAOF (7.2+) and does not fsync every write "
        f"(appendonly {appendonly}, appendfsync {appendfsync}); use Redis 7.2+ or "
        "appendonly yes with appendfsync always"
    )


def confirmation(
    level: Durability, support: FsyncSupport | None, timeout: float
) -> tuple[Any, ...] | None:
    """The command that confirms ``level`` after a write (``WAIT`` or ``WAITAOF``), or
    ``None`` when the reply itself does (a server that fsyncs every write). ``support``
    is needed for fsync levels only."""
    timeout_ms = max(1, int(timeout * 1000))
    if level.fsync:
        assert support is not None and support.problem is None
        if support.waitaof:
            return (b"WAITAOF", 1, level.replicas, timeout_ms)
        if not level.replicas:
            return None
    return (b"WAIT", level.replicas, timeout_ms)


def shortfall(command: Sequence[Any], reply: Any, level: Durability, timeout: float) -> str | None:
    """Why ``reply`` to the confirming ``command`` falls short of ``level``, or None."""
    if isinstance(reply, rex.RedisError):
        return f"{command[0]!r} failed: {reply}"
    if command[0] == b"WAIT":
        acked = int(reply)
        if acked >= level.replicas:
            return None
        return f"{acked} of {level.replicas} replica(s) acknowledged the push within {timeout:g}s"
    local, replicas = int(reply[0]), int(reply[1])
    if local >= 1 and replicas >= level.replicas:
        return None
    return (
        f"the master fsynced it {'' if local else 'not '}and {replicas} of "
        f"{level.replicas} replica(s) did within {timeout:g}s"
    )
