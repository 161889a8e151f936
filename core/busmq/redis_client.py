"""The redis-py side of a shard: commands packed by hiredis, a gate for the pools that
raise when full, and what Redis's refusals of a command mean for where to send it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import hiredis
import redis.exceptions as rex

T = TypeVar("T")
C = TypeVar("C")

CONNECTION_ERRORS = (rex.ConnectionError, rex.TimeoutError, OSError)


def gated(
    call: Callable[[C], Awaitable[T]], gate: asyncio.Semaphore
) -> Callable[[C], Awaitable[T]]:
    """``call`` holding one of ``gate``'s places. A full client pool is not an outage:
    redis-py's own reads (topology refreshes after a probe or a ``MOVED``) take pool
    connections outside the gate. Nothing was sent; wait a moment, send."""

    async def gated(client: C) -> T:
        async with gate:
            pause = 0.001
            while True:
                try:
                    return await call(client)
                except rex.MaxConnectionsError:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 0.05)

    return gated


def with_fast_packing(base: type[Any]) -> type[Any]:
    """``base`` (a redis-py connection class) packing commands with hiredis, in C.

    redis-py's async connections pack in Python, joining the buffer once per argument;
    a 100-message push (300+ arguments) costs ~190 us that way and ~38 us in hiredis.
    """

    class FastPacking(base):  # type: ignore[misc]
        def pack_command(self, *args: Any) -> list[bytes]:
            first = args[0]
            if (b" " if isinstance(first, bytes) else " ") in first:
                args = (*first.split(), *args[1:])  # e.g. "SCRIPT LOAD"
            try:
                return [hiredis.pack_command(args)]
            except TypeError:  # let redis-py raise its usual error for the odd type
                return super().pack_command(*args)  # type: ignore[no-any-return]

    FastPacking.__name__ = f"FastPacking{base.__name__}"
    return FastPacking


@dataclass(frozen=True)
class Redirect:
    """A command refused where it was sent, applied nowhere: send it again, where the
    shard now routes it, or once to ``ask`` (a cluster's ``ASK`` target) for the calls
    that can. ``pause``: back off first (the refusal lasts a moment, e.g. a failover)."""

    ask: tuple[str, int] | None = None
    pause: bool = True


def is_wrong_node(exc: rex.ResponseError) -> bool:
    """Whether Redis refused a command because it is not (or no longer) a writable
    master; scripts report it inside their error text."""
    text = str(exc)
    return isinstance(exc, rex.ReadOnlyError | rex.MasterDownError) or any(
        code in text for code in ("READONLY ", "MASTERDOWN ")
    )


def raw_reply(response: Any, **options: Any) -> Any:
    """A reply as Redis sent it (stream reads are decoded by busmq, not redis-py)."""
    return response
