"""A real ``redis-server`` for tests: free loopback port, private directory, torn down after.

Never touches a server the tests did not start (in particular not port 6379).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import redis.asyncio as aioredis


def free_port(offsets: tuple[int, ...] = (0,)) -> int:
    """A loopback port that was free a moment ago, below the kernel's ephemeral range:
    a port the kernel hands out (port 0) may be taken by an outgoing connection before
    the server binds it, one below that range only by another listener. ``offsets``:
    ports that must be free too, relative to the one returned (a cluster node's bus
    port is port + 10000)."""
    start, stop = _worker_ports(_ephemeral_low() - max(offsets))
    for _ in range(1000):
        port = _RANDOM.randrange(start, stop)
        taken = {port + offset for offset in offsets}
        if not taken & _HANDED_OUT and all(_bindable(p) for p in taken):
            _HANDED_OUT.update(taken)
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


# Ports handed out are not handed out again in this process (several servers are often
# given their ports before any of them binds), and the choice does not follow the global
# random state, which a test (or hypothesis) may have seeded.
_HANDED_OUT: set[int] = set()
_RANDOM = random.Random()


def _worker_ports(low: int) -> tuple[int, int]:
    """This pytest-xdist worker's share of the ports from 10000 to ``low``: workers never
    pick the same port, even one another worker's server left free for a moment while it
    restarts (the whole range without xdist)."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    share = (low - 10_000) // count
    return 10_000 + worker * share, 10_000 + (worker + 1) * share


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def terminate(process: asyncio.subprocess.Process, grace: float = 10.0) -> None:
    """SIGTERM ``process`` (ours, by PID), SIGKILL it after ``grace`` seconds, reap it."""
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()


def redis_binary() -> str:
    """``$BUSMQ_TEST_REDIS_SERVER``, else the one the embedded Redis would use."""
    from busmq.embedded import find_redis_server

    return os.environ.get("BUSMQ_TEST_REDIS_SERVER") or find_redis_server()


@dataclass(frozen=True)
class Tls:
    """PEM files for a TLS-only server; with ``client_ca`` clients must show a
    certificate signed by it."""

    cert: Path
    key: Path
    ca: Path
    client_ca: bool = False


class RedisServer:
    """``async with RedisServer(tmp_path) as server: server.url``; ``kill()`` and
    ``start()`` again to simulate a crash and a restart on the same port and data.

    Options: ``password`` (``requirepass``, or the password of ``username``, an ACL
    user with every right, the default user being switched off), ``unix_socket`` (a
    unix socket only, no TCP port), ``tls`` (TLS only, on ``port``). ``url`` carries
    what a client needs to reach and log in."""

    def __init__(
        self,
        directory: Path,
        *,
        appendonly: bool = True,
        password: str | None = None,
        username: str | None = None,
        unix_socket: bool = False,
        tls: Tls | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        if username is not None and password is None:
            raise ValueError("an ACL user needs a password")
        self.directory = Path(directory)
        self.port = free_port()
        self.appendonly = appendonly
        self.password = password
        self.username = username
        self.tls = tls
        self.extra_args = extra_args
        self._socket_dir: str | None = None
        self.socket_path = self._socket_path() if unix_socket else ""
        self.process: asyncio.subprocess.Process | None = None

    def _socket_path(self) -> str:
        path = str(self.directory.resolve() / "redis.sock")
        if len(path) <= 100:  # the limit of a unix socket path is 107 bytes
            return path
        self._socket_dir = tempfile.mkdtemp(prefix="busmq-test-")
        return os.path.join(self._socket_dir, "redis.sock")

    @property
    def url(self) -> str:
        login = ""
        if self.password is not None:
            login = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        if self.socket_path:
            return f"unix://{login}{self.socket_path}"
        if self.tls is None:
            return f"redis://{login}127.0.0.1:{self.port}"
        query = {"ssl_ca_certs": str(self.tls.ca)}
        if self.tls.client_ca:
            query |= {"ssl_certfile": str(self.tls.cert), "ssl_keyfile": str(self.tls.key)}
        return f"rediss://{login}127.0.0.1:{self.port}?{urlencode(query)}"

    def _arguments(self) -> list[str]:
        args = [
            redis_binary(),
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        if self.socket_path:
            args += ["--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        elif self.tls is not None:
            args += ["--bind", "127.0.0.1", "--port", "0", "--tls-port", str(self.port)]
            args += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
            args += ["--tls-ca-cert-file", str(self.tls.ca)]
            args += ["--tls-auth-clients", "yes" if self.tls.client_ca else "no"]
        else:
            args += ["--bind", "127.0.0.1", "--port", str(self.port)]
        if self.username is not None:
            args += ["--user", "default", "off"]
            args += ["--user", self.username, "on", f">{self.password}", "~*", "&*", "+@all"]
        elif self.password is not None:
            args += ["--requirepass", self.password]
        return args + list(self.extra_args)

    async def start(self, timeout: float = 10.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._socket_dir is not None:
            os.makedirs(self._socket_dir, exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            *self._arguments(),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await self._wait_ready(timeout)
        except BaseException:
            await self.stop()  # a server that never became ready is not left behind
            raise

    async def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        client = self.client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                if self.process.returncode is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited: {log}")
                with contextlib.suppress(Exception):
                    if await client.ping():
                        return
                if loop.time() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} not ready")
                await asyncio.sleep(0.01)  # polling until redis-server answers
        finally:
            await client.aclose()

    def kill(self) -> None:
        """SIGKILL: the server dies without any chance to clean up."""
        self.signal(signal.SIGKILL)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the server (SIGSTOP / SIGCONT: a server that stops answering)."""
        if self.process is not None and self.process.returncode is None:
            os.kill(self.process.pid, sig)

    async def wait_exit(self) -> None:
        if self.process is not None:
            await self.process.wait()

    async def stop(self) -> None:
        if self.process is None:
            return
        await terminate(self.process)
        self.process = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def client(self, db: int = 0) -> aioredis.Redis:
        """A redis-py client of the server (logged in, on database ``db``)."""
        url = self.url + ("&" if "?" in self.url else "?") + f"db={db}"
        client: aioredis.Redis = aioredis.Redis.from_url(url)
        return client

    async def command_calls(self, command: str) -> int:
        """How many times the server ran ``command`` (``INFO commandstats``)."""
        client = self.client()
        try:
            stats = await client.info("commandstats")
        finally:
            await client.aclose()
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    async def __aenter__(self) -> RedisServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
