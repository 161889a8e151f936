"""Durable writes confirmed together: the writes submitted in one event-loop tick go out
back to back on the shard's durable connection, followed by one ``WAIT`` (or
``WAITAOF``) that confirms them all.

``WAIT`` waits for every earlier write of its connection and blocks that connection
until it answers, so one confirmation per write would queue each write behind the
previous write's replica round trip. One per tick costs a single round trip however
many producers push concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.exceptions as rex

from .mux import Arg, Command, MuxClient

_MAX_BATCH = 1000


class ConfirmedWrites:
    """Runs scripts on ``mux``, each confirmed by the confirmation command sent after it
    (shared with the other scripts of its tick that need the same one)."""

    def __init__(self, mux: MuxClient) -> None:
        self._mux = mux
        self._waiting: dict[tuple[Any, ...], list[tuple[Command, asyncio.Future[Any]]]] = {}
        self._flushes: set[asyncio.Task[None]] = set()

    async def run_script(
        self, sha: str, source: Arg, keys: Sequence[Arg], args: Sequence[Arg], confirm: Command
    ) -> tuple[Any, Any]:
        """``EVALSHA`` then ``confirm``; returns the script's reply and the confirmation's
        (as a value, even an error). A script error is raised; on ``NOSCRIPT`` (it did not
        run) the script is loaded and sent again with a confirmation of its own."""
        script: Command = (b"EVALSHA", sha, len(keys), *keys, *args)
        reply, after = await self._submit(script, tuple(confirm))
        if isinstance(reply, rex.NoScriptError):
            await self._mux.execute(b"SCRIPT", b"LOAD", source)
            reply, after = await self._mux.execute_many([script, confirm])
        if isinstance(reply, rex.RedisError):
            raise reply
        return reply, after

    async def _submit(self, script: Command, confirm: tuple[Any, ...]) -> Any:
        batch = self._waiting.get(confirm)
        if batch is None:
            batch = self._waiting[confirm] = []
            flush = asyncio.create_task(self._flush(confirm))
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        batch.append((script, future))
        return await future

    async def _flush(self, confirm: tuple[Any, ...]) -> None:
        await asyncio.sleep(0)  # the writes of this tick join the batch
        batch = self._waiting.pop(confirm, [])
        for start in range(0, len(batch), _MAX_BATCH):
            part = batch[start : start + _MAX_BATCH]
            try:
                replies = await self._mux.execute_many([*(s for s, _ in part), confirm])
            except BaseException as exc:
                for _, future in part:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            after = replies[-1]
            for (_, future), reply in zip(part, replies, strict=False):
                if not future.done():
                    future.set_result((reply, after))
