"""A real Sentinel deployment for tests: a master, its replicas and three Sentinels, each
a ``redis-server`` process on a free loopback port, stopped by PID afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import redis.asyncio as aioredis

from tests.support.redis_server import RedisServer, free_port, redis_binary, terminate
from tests.support.waiting import eventually

SERVICE = "busmq-test"


class SentinelProcess:
    """``redis-server sentinel.conf --sentinel`` monitoring one master."""

    def __init__(self, directory: Path, master_port: int, quorum: int) -> None:
        self.directory = directory
        self.port = free_port()
        self.master_port = master_port
        self.quorum = quorum
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, attempts: int = 3) -> None:
        """Start and wait until it answers. A port taken between ``free_port`` and the
        bind (another process of the machine) makes it exit: it is started again on
        another port."""
        for attempt in range(attempts):
            if attempt:
                self.port = free_port()
            self.process = await asyncio.create_subprocess_exec(
                redis_binary(),
                str(self._write_conf()),
                "--sentinel",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            if await self._answers():
                return
            await self.stop()
        log = (self.directory / "sentinel.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"sentinel did not start in {attempts} attempts: {log}")

    def _write_conf(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "sentinel.conf"  # Sentinel rewrites it: a file of its own
        conf.write_text(
            f"bind 127.0.0.1\nport {self.port}\ndir {self.directory}\n"
            f"logfile {self.directory / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 3000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        return conf

    async def _answers(self, timeout: float = 10.0) -> bool:
        """Whether it answers PING within ``timeout`` (False as soon as it exited)."""
        assert self.process is not None
        client = self.client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while self.process.returncode is None and loop.time() < deadline:
                with contextlib.suppress(Exception):
                    if await client.ping():
                        return True
                await asyncio.sleep(0.01)
            return False
        finally:
            await client.aclose()

    def client(self) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    async def stop(self) -> None:
        if self.process is not None:
            await terminate(self.process)
        self.process = None


class SentinelGroup:
    """``async with SentinelGroup(tmp_path) as group: group.url``; ``group.master`` is the
    server the Sentinels name master now (after :meth:`wait_failover`, the new one)."""

    def __init__(self, directory: Path, *, replicas: int = 2, sentinels: int = 3) -> None:
        self.directory = directory
        self.servers = [
            RedisServer(
                directory / "master",
                appendonly=False,
                extra_args=("--repl-diskless-sync-delay", "0"),
            )
        ]
        master_port = self.servers[0].port
        replica_args = ("--replicaof", "127.0.0.1", str(master_port))
        for i in range(replicas):
            self.servers.append(
                RedisServer(
                    directory / f"replica{i}",
                    appendonly=False,
                    extra_args=(*replica_args, "--repl-diskless-sync-delay", "0"),
                )
            )
        self.sentinels = [
            SentinelProcess(directory / f"sentinel{i}", master_port, quorum=2)
            for i in range(sentinels)
        ]
        self.master = self.servers[0]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    @property
    def replicas(self) -> list[RedisServer]:
        return [s for s in self.servers if s is not self.master]

    async def start(self) -> None:
        for server in self.servers:
            await server.start()
        await self._wait_replicas_linked()
        for sentinel in self.sentinels:
            await sentinel.start()
        await eventually(self._sentinels_ready, timeout=20, what="sentinels see each other")

    async def _wait_replicas_linked(self) -> None:
        async def linked() -> bool:
            for replica in self.replicas:
                client = replica.client()
                try:
                    info = await client.info("replication")
                finally:
                    await client.aclose()
                if info.get("master_link_status") != "up":
                    return False
            return True

        await eventually(linked, timeout=20, what="replicas in sync with the master")

    async def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                with contextlib.suppress(Exception):
                    state = (await client.sentinel_masters()).get(SERVICE)
                    if state is None:
                        return False
                    if state["num-other-sentinels"] < len(self.sentinels) - 1:
                        return False
                    if state["num-slaves"] < len(self.replicas):
                        return False
                    continue
                return False
            finally:
                await client.aclose()
        return True

    async def master_address(self) -> tuple[str, int]:
        """The master as the first Sentinel that answers names it."""
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                with contextlib.suppress(Exception):
                    host, port = await client.sentinel_get_master_addr_by_name(SERVICE)
                    return str(host), int(port)
            finally:
                await client.aclose()
        raise AssertionError("no Sentinel answers")

    async def wait_failover(self, timeout: float = 30) -> RedisServer:
        """Wait until the Sentinels name another master; returns it."""
        old = self.master

        async def moved() -> bool:
            _, port = await self.master_address()
            return port != old.port

        await eventually(moved, timeout=timeout, what="sentinel failover")
        _, port = await self.master_address()
        self.master = next(s for s in self.servers if s.port == port)
        return self.master

    async def stop(self) -> None:
        for sentinel in self.sentinels:
            await sentinel.stop()
        for server in self.servers:
            await server.stop()

    async def __aenter__(self) -> SentinelGroup:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
