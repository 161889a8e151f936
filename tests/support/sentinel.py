"""A real Sentinel deployment for tests: a master, its replicas and three Sentinels, each
a ``redis-server`` process on a free loopback port, stopped by PID afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import redis.asyncio as aioredis
import redis.exceptions

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
                await asyncio.sleep(0.01)  # polling until the Sentinel answers
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
        await self.wait_replicas_linked(sentinels=False)
        for sentinel in self.sentinels:
            await sentinel.start()
        await eventually(self._sentinels_ready, timeout=20, what="sentinels see each other")

    async def wait_replicas_linked(self, *, sentinels: bool = True) -> None:
        """Every server but the master replicates from it, link up; with ``sentinels``,
        the master is the one every Sentinel names (they may have failed over again)."""

        async def linked() -> bool:
            if sentinels:
                agreed = await self._agreed_master()
                if agreed is None:
                    return False
                self.master = agreed
            for replica in self.replicas:
                client = replica.client()
                try:
                    info = await client.info("replication")
                except redis.exceptions.ConnectionError:  # Sentinel reconfiguring it
                    return False
                finally:
                    await client.aclose()
                if info.get("master_link_status") != "up":
                    return False
                if int(info.get("master_port", 0)) != self.master.port:
                    return False
            return True

        try:
            await eventually(linked, timeout=20, what="replicas in sync with the master")
        except AssertionError:
            states = []
            for server in self.servers:
                client = server.client()
                try:
                    info = await client.info("replication")
                except Exception as exc:
                    info = {"error": repr(exc)}
                finally:
                    await client.aclose()
                fields = ("role", "master_port", "master_link_status")
                states.append((server.port, {k: info.get(k) for k in (*fields, "error")}))
            raise AssertionError(
                f"replicas not in sync with {self.master.port}: {states}"
            ) from None

    async def wait_sentinels_can_promote(self, timeout: float = 30) -> None:
        """Every Sentinel lists a live replica as healthy, one it could promote if the
        master died now. (Sentinels learn that a rejoined server is healthy from its
        INFO, every 10 s; the next failover does not need to wait for that.)"""
        ports = {r.port for r in self.replicas}

        async def ready() -> bool:
            return all(ports & _healthy(view) for view in await self._replica_views())

        try:
            await eventually(ready, timeout=timeout, what="sentinels can promote a replica")
        except AssertionError:
            raise AssertionError(
                f"not every Sentinel knows one of replicas {sorted(ports)} as healthy within "
                f"{timeout}s: {await self.describe()}"
            ) from None

    async def _replica_views(self) -> list[list[dict[str, object]] | str]:
        """Each Sentinel's list of the master's replicas, or why it gave none."""
        views: list[list[dict[str, object]] | str] = []
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                views.append(await client.sentinel_slaves(SERVICE))
            except redis.exceptions.RedisError as exc:
                views.append(repr(exc))
            finally:
                await client.aclose()
        return views

    async def describe(self) -> str:
        """What each Sentinel says of the replicas, and the end of its log."""
        lines = [f"master {self.master.port}"]
        for sentinel, view in zip(self.sentinels, await self._replica_views(), strict=True):
            alive = sentinel.process is not None and sentinel.process.returncode is None
            if isinstance(view, str):
                seen = view
            else:
                seen = ", ".join(
                    f"{r.get('port')} {r.get('flags')} link={r.get('master-link-status')}"
                    for r in view
                )
            log = sentinel.directory / "sentinel.log"
            tail = log.read_text(errors="replace").splitlines()[-12:] if log.exists() else []
            client = sentinel.client()
            try:
                state = await client.sentinel_master(SERVICE)
                master = f"{state['port']} {state['flags']}"
            except redis.exceptions.RedisError as exc:
                master = repr(exc)
            finally:
                await client.aclose()
            lines.append(f"sentinel {sentinel.port} alive={alive}: master {master}; {seen}")
            lines += [f"  | {line}" for line in tail]
        return "\n".join(lines)

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

    async def kill_master(self) -> RedisServer:
        """SIGKILL the master and wait for the Sentinels to promote a replica; returns the
        old master (dead; ``rejoin`` brings it back as a replica)."""
        old = self.master
        old.kill()
        await old.wait_exit()
        assert await self.wait_failover() is not old
        return old

    async def wait_failover(self, timeout: float = 30) -> RedisServer:
        """Wait until the Sentinels name another master; returns it."""
        old = self.master
        found: list[RedisServer] = []

        async def moved() -> bool:
            # Every Sentinel names the same new master, and it is one: the failover is
            # over (a restarted old master would otherwise be taken back, empty).
            agreed = await self._agreed_master()
            if agreed is None or agreed is old:
                return False
            found.append(agreed)
            return True

        try:
            await eventually(moved, timeout=timeout, what="sentinel failover")
        except AssertionError:
            raise AssertionError(
                f"no failover from {old.port} within {timeout}s: {await self.describe()}"
            ) from None
        self.master = found[-1]
        return self.master

    async def _agreed_master(self) -> RedisServer | None:
        """The server every Sentinel names master with no failover in progress, if it is
        one; else ``None``. While a Sentinel leads a failover it names the replica it
        promoted, before that failover ends: a test that kills that server then leaves
        the leader stuck for good (it ends a failover only once its promoted replica is
        up), so it names the dead server from then on."""
        ports = set()
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                state = await client.sentinel_master(SERVICE)
            except redis.exceptions.RedisError:
                return None
            finally:
                await client.aclose()
            flags = state["flags"]
            if (set(flags.split(",")) if isinstance(flags, str) else set(flags)) != {"master"}:
                return None  # failing over, or down
            ports.add(int(state["port"]))
        if len(ports) != 1:
            return None
        named = next(s for s in self.servers if s.port in ports)
        client = named.client()
        try:
            role = (await client.info("replication")).get("role")
        except redis.exceptions.RedisError:
            return None
        finally:
            await client.aclose()
        return named if role == "master" else None

    async def rejoin(self, server: RedisServer) -> None:
        """Restart a killed server as a replica of the master (as an operator would: it
        never comes back as a second, empty master)."""
        args = list(server.extra_args)
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at : at + 3]
        server.extra_args = (*args, "--replicaof", "127.0.0.1", str(self.master.port))
        await server.start()

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


def _healthy(view: list[dict[str, object]] | str) -> set[int]:
    """The ports of the replicas a Sentinel could promote."""
    if isinstance(view, str):
        return set()
    return {
        int(str(r["port"]))
        for r in view
        if r["is_slave"]
        and not (r["is_sdown"] or r["is_odown"] or r["is_disconnected"])
        and r.get("master-link-status") == "ok"
    }
