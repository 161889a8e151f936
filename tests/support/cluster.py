"""A real Redis Cluster for tests: masters (and replicas) as ``redis-server`` processes on
free loopback ports, joined with ``redis-cli --cluster create``, stopped by PID."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import redis.asyncio as aioredis

from tests.support.redis_server import RedisServer, free_port, redis_binary
from tests.support.waiting import eventually


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    return free_port(offsets=(0, 10_000))


def redis_cli() -> str:
    """``redis-cli`` next to the ``redis-server`` the tests run."""
    beside = Path(redis_binary()).with_name("redis-cli")
    return str(beside) if beside.exists() else (shutil.which("redis-cli") or "redis-cli")


class ClusterGroup:
    """``async with ClusterGroup(tmp_path, masters=3, replicas=1) as cluster: cluster.url``."""

    def __init__(self, directory: Path, *, masters: int = 3, replicas: int = 0) -> None:
        self.directory = directory
        self.masters_count = masters
        self.replicas_per_master = replicas
        self.servers: list[RedisServer] = []
        options = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        options += ("--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0")
        for i in range(masters * (1 + replicas)):
            server = RedisServer(directory / f"node{i}", appendonly=False, extra_args=options)
            server.port = cluster_port()
            self.servers.append(server)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:2])

    def client(self) -> aioredis.RedisCluster:
        return aioredis.RedisCluster(host="127.0.0.1", port=self.servers[0].port)

    async def start(self) -> None:
        for server in self.servers:
            await server.start()
        create = await asyncio.create_subprocess_exec(
            redis_cli(),
            "--cluster", "create",
            *(f"127.0.0.1:{s.port}" for s in self.servers),
            "--cluster-replicas", str(self.replicas_per_master),
            "--cluster-yes",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if k != "REDISCLI_AUTH"},
        )  # fmt: skip
        output, _ = await create.communicate()
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {output.decode()[-2000:]}")
        await eventually(self._all_ok, timeout=30, what="cluster_state:ok on every node")

    async def _all_ok(self) -> bool:
        for server in self.servers:
            if server.process is None or server.process.returncode is not None:
                continue
            client = server.client()
            try:
                info = await client.execute_command("CLUSTER", "INFO")
            except Exception:
                return False
            finally:
                await client.aclose()
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
        return True

    async def role_of(self, server: RedisServer) -> str:
        client = server.client()
        try:
            role = await client.execute_command("ROLE")
        finally:
            await client.aclose()
        kind = role[0]
        return kind.decode() if isinstance(kind, bytes) else str(kind)

    async def command(self, server: RedisServer, *args: object) -> object:
        client = server.client()
        try:
            return await client.execute_command(*args)
        finally:
            await client.aclose()

    async def masters(self) -> list[RedisServer]:
        """The running servers that are masters now."""
        running = [s for s in self.servers if s.process and s.process.returncode is None]
        return [s for s in running if await self.role_of(s) == "master"]

    async def owner_of(self, slot: int) -> RedisServer:
        """The master serving ``slot`` now."""
        for server in await self.masters():
            slots: list[list[object]] = await self.command(server, "CLUSTER", "SLOTS")  # type: ignore[assignment]
            for start, end, master, *_ in slots:
                if int(start) <= slot <= int(end):  # type: ignore[call-overload]
                    port = int(master[1])  # type: ignore[index]
                    return next(s for s in self.servers if s.port == port)
        raise AssertionError(f"no master serves slot {slot}")

    async def move_slot(self, slot: int, target: RedisServer, batch: int = 10) -> int:
        """Migrate ``slot`` to ``target`` as ``redis-cli --cluster reshard`` does
        (IMPORTING/MIGRATING, ``MIGRATE`` in batches of ``batch`` keys, then ``SETSLOT
        NODE`` on every master), letting traffic run between batches; returns the keys
        moved."""
        source = await self.owner_of(slot)
        assert source is not target
        source_id = _text(await self.command(source, "CLUSTER", "MYID"))
        target_id = _text(await self.command(target, "CLUSTER", "MYID"))
        await self.command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        await self.command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        moved = 0
        client = source.client()
        try:
            while keys := await client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                await client.execute_command(
                    "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
                )
                moved += len(keys)
                await asyncio.sleep(0)  # let the bus's calls run between batches of moved keys
        finally:
            await client.aclose()
        for server in await self.masters():
            await self.command(server, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()

    async def __aenter__(self) -> ClusterGroup:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
