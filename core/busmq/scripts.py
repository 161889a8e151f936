"""The Lua scripts that make multi-key queue operations atomic and single-round-trip.

Each script touches only keys of one queue (one ``{name}`` hash tag), so it runs
unchanged on Redis Cluster; ``forward`` alone touches two queues, and is run only where
both live on one server that is not a cluster. The sources live in ``lua/``:
``prelude.lua`` holds helpers shared by all of them, ``push_lib.lua`` and ``ack_lib.lua``
the parts of a push and an ack that ``forward`` does too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from .mux import MuxClient

_PARTS = {
    "push": ("push_lib", "push"),
    "ack": ("ack_lib", "ack"),
    "ack_upto": ("ack_lib", "ack_upto"),
    "forward": ("push_lib", "ack_lib", "forward"),
    "forward_out": ("ack_lib", "forward_out"),
}
"""Scripts made of shared parts besides the prelude, in order."""


def script_source(name: str, sharded_publish: bool = False) -> str:
    """The full source of script ``name``: what it uses of the prelude, its shared
    parts, its own."""
    lua = resources.files(__package__) / "lua"
    body = "\n".join((lua / f"{part}.lua").read_text() for part in _PARTS.get(name, (name,)))
    source = used_prelude((lua / "prelude.lua").read_text(), body) + "\n" + body
    if sharded_publish:  # a cluster's sharded channel of the queue's slot (Redis 7+)
        source = source.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
    return source


_DEFINITION = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)")
_NAME = re.compile(r"[A-Za-z_]\w*")


def used_prelude(prelude: str, body: str) -> str:
    """The definitions of ``prelude`` that ``body`` uses, directly or through one
    another, in their order.

    Redis runs a script's whole source on every call, so each ``local function`` of
    the prelude is a closure made again each time: the whole prelude cost 4.5 us a
    call (measured with EVALSHA), more than a single push's own writes. A definition
    starts at a line ``local ...`` in the first column, with the comments above it."""
    chunks: list[tuple[set[str], str]] = []
    pending: list[str] = []
    for line in prelude.splitlines(keepends=True):
        match = _DEFINITION.match(line)
        if match:
            names = match.group(1) or match.group(2)
            chunks.append(({n.strip() for n in names.split(",")}, "".join(pending) + line))
            pending = []
        elif chunks and not line.startswith("--") and line.strip():
            chunks[-1] = (chunks[-1][0], chunks[-1][1] + "".join(pending) + line)
            pending = []
        else:
            pending.append(line)
    wanted = set(_NAME.findall(body))
    included = [False] * len(chunks)
    grew = True
    while grew:  # a definition used by an included one is included too
        grew = False
        for i, (names, text) in enumerate(chunks):
            if not included[i] and names & wanted:
                included[i] = grew = True
                wanted |= set(_NAME.findall(text))
    return "".join(text for (_, text), keep in zip(chunks, included, strict=True) if keep)


class Scripts:
    """The scripts, run with EVALSHA on any client (loaded again on NOSCRIPT)."""

    NAMES = (
        "attach",
        "detach",
        "push",
        "ack",
        "ack_upto",
        "claim",
        "prepare_consumer",
        "release",
        "read",
        "settle",
        "requeue",
        "promote",
        "controls",
        "leave",
        "forward",
        "forward_out",
        "order",
        "order_stats",
        "schema",
    )

    def __init__(self, client: aioredis.Redis, *, sharded_publish: bool = False) -> None:
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(script_source(name, sharded_publish))
            for name in self.NAMES
        }

    def source(self, name: str) -> tuple[str, str]:
        """Script ``name``'s SHA1 and source."""
        script = self._scripts[name]
        return script.sha, str(script.script)

    async def call(
        self,
        client: aioredis.Redis | MuxClient,
        name: str,
        keys: Sequence[str],
        args: Sequence[str | bytes | int | float],
    ) -> Any:
        """Run script ``name`` on ``client`` (loading it first if the server lost it)."""
        script = self._scripts[name]
        if isinstance(client, MuxClient):
            return await client.run_script(script.sha, script.script, keys, args)
        return await script(keys=list(keys), args=list(args), client=client)
