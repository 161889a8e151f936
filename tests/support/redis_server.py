"""A real ``redis-server`` for tests: free loopback port, private directory, torn down after.

Never touches a server the tests did not start (in particular not port 6379).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from pathlib import Path

import redis.asyncio as aioredis


def free_port() -> int:
    """A loopback port that was free a moment ago (below the ephemeral range when possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_binary() -> str:
    """``$BUSMQ_TEST_REDIS_SERVER``, else the one the embedded Redis would use."""
    from busmq.embedded import find_redis_server

    return os.environ.get("BUSMQ_TEST_REDIS_SERVER") or find_redis_server()


class RedisServer:
    """``async with RedisServer(tmp_path) as server: server.url``; ``kill()`` and
    ``start()`` again to simulate a crash and a restart on the same port and data."""

    def __init__(self, directory: Path, *, appendonly: bool = True) -> None:
        self.directory = Path(directory)
        self.port = free_port()
        self.appendonly = appendonly
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 10.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            redis_binary(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        self.process = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        await self._wait_ready(timeout)

    async def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        client = aioredis.Redis(host="127.0.0.1", port=self.port)
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
                await asyncio.sleep(0.01)
        finally:
            await client.aclose()

    def kill(self) -> None:
        """SIGKILL: the server dies without any chance to clean up."""
        if self.process is not None and self.process.returncode is None:
            os.kill(self.process.pid, signal.SIGKILL)

    async def wait_exit(self) -> None:
        if self.process is not None:
            await self.process.wait()

    async def stop(self) -> None:
        if self.process is None:
            return
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self.process = None

    def client(self) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=self.port)

    async def __aenter__(self) -> RedisServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
