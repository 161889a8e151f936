"""Micro-benchmarks behind NOTES-core.md: what one Redis command costs the client.

    .venv/bin/python bench/micro_client.py

Starts its own redis-server (like core_bench.py). Prints CPU microseconds per command
for redis-py's async client in several configurations and for a minimal auto-pipelined
connection (asyncio.Protocol + hiredis), sequential and with 100 concurrent callers,
plus the cost of packing a 100-message push and of building one delivered message.
"""

from __future__ import annotations

import asyncio
import collections
import time
import timeit
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from _redis import local_redis

N = 20_000


class _Mux(asyncio.Protocol):
    """One connection; commands of one loop iteration go out in one write."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.out: list[bytes] = []
        self.scheduled = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.waiters.popleft().set_result(reply)

    def _flush(self) -> None:
        self.scheduled = False
        out, self.out = self.out, []
        assert self.transport is not None
        self.transport.write(b"".join(out))

    def execute(self, *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiters.append(future)
        self.out.append(hiredis.pack_command(args))
        if not self.scheduled:
            self.scheduled = True
            loop.call_soon(self._flush)
        return future


async def _cpu_per_op(call: Callable[[bytes], Awaitable[Any]]) -> tuple[float, float]:
    """CPU us per call: one caller in sequence, then 100 concurrent callers."""
    start = time.process_time
    t0 = start()
    for _ in range(N):
        await call(b"k")
    sequential = (start() - t0) / N * 1e6

    async def worker(key: bytes) -> None:
        for _ in range(N // 100):
            await call(key)

    t0 = start()
    await asyncio.gather(*(worker(b"k%d" % i) for i in range(100)))
    concurrent = (start() - t0) / N * 1e6
    return sequential, concurrent


async def client_costs(port: int) -> None:
    value = b"x" * 32
    variants: list[tuple[str, aioredis.Redis]] = [
        ("redis-py default (socket_timeout=5)", aioredis.Redis(port=port)),
        ("redis-py socket_timeout=None", aioredis.Redis(port=port, socket_timeout=None)),
        (
            "redis-py BlockingConnectionPool, timeout 5",
            aioredis.Redis(
                connection_pool=aioredis.BlockingConnectionPool(
                    port=port, max_connections=128, timeout=None, socket_timeout=5
                )
            ),
        ),
    ]
    print(f"{'client':46}{'sequential':>12}{'100 callers':>13}   (CPU us per RPUSH)")
    for label, client in variants:
        await client.ping()
        seq, conc = await _cpu_per_op(lambda key, c=client: c.rpush(key, value))  # type: ignore[misc]
        print(f"{label:46}{seq:12.1f}{conc:13.1f}")
        await client.aclose()
    loop = asyncio.get_running_loop()
    transport, mux = await loop.create_connection(_Mux, "127.0.0.1", port)
    seq, conc = await _cpu_per_op(lambda key: mux.execute(b"RPUSH", key, value))
    print(f"{'auto-pipelined Protocol + hiredis':46}{seq:12.1f}{conc:13.1f}")
    transport.close()


@dataclass(frozen=True, slots=True)
class _Frozen:
    id: int
    payload: bytes
    kind: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timestamp_ms: int = 0


@dataclass(slots=True)
class _Plain:
    id: int
    payload: bytes
    kind: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timestamp_ms: int = 0


def cpu_costs() -> None:
    args: list[Any] = [b"EVALSHA", b"a" * 40, 2, b"busmq:{q}:i", b"busmq:{q}:s", 600000, b"n"]
    args += [b"x" * 32, b"b", b""] * 100
    conn = Connection()
    n = 3000
    py = timeit.timeit(lambda: conn.pack_command(*args), number=n) / n * 1e6
    c = timeit.timeit(lambda: hiredis.pack_command(tuple(args)), number=n) / n * 1e6
    print(f"\npack a 100-message push (302 args): redis-py {py:.0f} us, hiredis {c:.0f} us")
    flat = [b"p", b"x" * 32, b"k", b"b", b"t", b"1700000000000"]
    n = 200_000
    costs = {
        "pairs_to_dict (redis-py XREADGROUP callback)": "dict(zip(flat[::2], flat[1::2]))",
        "frozen slots dataclass (Message today)": "_Frozen(1, b'x', None, {}, 5)",
        "non-frozen slots dataclass": "_Plain(1, b'x', None, {}, 5)",
        "int(entry_id[:entry_id.index(b'-')])": "int(eid[:eid.index(b'-')])",
    }
    scope = {"flat": flat, "_Frozen": _Frozen, "_Plain": _Plain, "eid": b"12345-0"}
    print("per delivered message:")
    for label, stmt in costs.items():
        ns = timeit.timeit(stmt, globals=scope, number=n) / n * 1e9
        print(f"  {label:46}{ns:8.0f} ns")


def main() -> None:
    with local_redis() as server:
        asyncio.run(client_costs(server.port))
    cpu_costs()


if __name__ == "__main__":
    main()
