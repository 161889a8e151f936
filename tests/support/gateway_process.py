"""A real ``busmq-gateway`` process for tests that need to signal, kill or measure it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

from busmq import Bus
from busmq_gateway import Gateway, GatewaySettings
from tests.support.redis_server import free_port

GATEWAY_CMD = [sys.executable, "-m", "busmq_gateway"]
ROOT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "gateway-principals.toml"
"""The example principals file of the README."""
READY = b"busmq gateway ready"
OUTPUT_KEPT = 200


def gateway_env() -> dict[str, str]:
    """This process's environment without any ``BUSMQ_`` setting, as a new user's shell
    has it, but for the gateway's HTTP listener: on a free port, not the default 8444,
    which two gateways started at once (on two pytest-xdist workers) would share."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSMQ_")}
    return env | {"BUSMQ_GATEWAY_HTTP_LISTEN": "127.0.0.1:0"}


async def spawn_until_ready(
    *argv: str,
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float = 20.0,
) -> tuple[asyncio.subprocess.Process, list[str]]:
    """Start a command that runs a gateway (``busmq-gateway``, ``scripts/run.sh``, ...)
    and return once it logged that it is ready: the process and what it printed so far.
    Its later output is read and dropped, so the pipe never fills."""
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert process.stdout is not None
    output: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            while not output or READY not in output[-1].encode():
                line = await process.stdout.readline()
                if not line:
                    raise RuntimeError("exited before it was ready:\n" + "".join(output))
                output.append(line.decode())
    except BaseException:
        if process.returncode is None:
            process.kill()
        await process.wait()
        raise
    _drains.add(asyncio.create_task(_drain(process.stdout)))
    return process, output


_drains: set[asyncio.Task[None]] = set()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


class GatewayProcess:
    def __init__(
        self,
        redis_url: str,
        secrets: tuple[str, ...] = ("gateway-secret-0123456789",),
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.secrets = secrets
        self.extra = extra
        self.env = env or {}
        self.port = free_port()
        self.http_port: int | None = None  # once started, with an HTTP listener
        self.process: asyncio.subprocess.Process | None = None
        self.recent: deque[str] = deque(maxlen=OUTPUT_KEPT)  # its last lines, for failures

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, timeout: float = 20.0) -> None:
        args = [
            *GATEWAY_CMD,
            "--listen", self.target,
            "--redis-url", self.redis_url,
            "--log-format", "text",
            "--grace-seconds", "5",
            *[f"--secret={s}" for s in self.secrets],  # one argument even if it starts with "-"
            *self.extra,
        ]  # fmt: skip
        env = {**os.environ, "BUSMQ_LEASE_SECONDS": "3", **self.env}
        self.process = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
        )
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    raise RuntimeError("gateway exited before it was ready")
                if b"busmq gateway ready" in line:
                    http = re.search(rb"http on port (\d+)", line)
                    self.http_port = int(http.group(1)) if http else None
                    break
        self._drain = asyncio.create_task(self._discard_output())

    async def _discard_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.recent.append(line.decode(errors="replace").rstrip())

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)

    async def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await self._drain
        return code

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.signal(signal.SIGTERM)
        try:
            await self.wait()
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


@contextlib.asynccontextmanager
async def running_gateway(settings: GatewaySettings) -> AsyncIterator[Gateway]:
    """An in-process gateway with ``settings``, started, stopped on leaving."""
    gateway = Gateway(settings)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


@contextlib.asynccontextmanager
async def gateway_and_remote_bus(
    redis_url: str, directory: Path, secret: str = "ha-gateway-secret"
) -> AsyncIterator[tuple[Bus, str]]:
    """A gateway process on ``redis_url`` and, on a Redis of its own, a bus that
    federates through it: yields the bus and the gateway's URL."""
    from busmq.federation import FederationSettings, FederationTarget
    from tests.conftest import fast_settings
    from tests.federation.conftest import FAST_LINK
    from tests.support.redis_server import RedisServer

    gateway = GatewayProcess(redis_url, (secret,))
    await gateway.start()
    try:
        async with (
            RedisServer(directory / "remote-redis") as redis,
            Bus(fast_settings([redis.url])) as bus,
        ):
            target = FederationTarget(f"http://{gateway.target}", secret=secret)
            outbox = directory / "outbox.sqlite3"
            bus.configure_federation(
                FederationSettings(targets=[target], outbox_path=outbox, **FAST_LINK)
            )
            yield bus, target.url
    finally:
        await gateway.stop()
