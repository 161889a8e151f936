"""Helper processes for multi-process tests: start a ``python -m tests.support.<module>``
that prints one JSON object per line, read its lines with a deadline, kill it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from busmq import BusSettings

ROOT = Path(__file__).resolve().parents[2]

# The same short leases and reads as the fixtures in tests/conftest.py.
FAST_SETTINGS: dict[str, Any] = {
    "lease_seconds": 3.0,
    "block_seconds": 0.2,
    "operation_timeout": 3.0,
    "health_interval": 0.2,
    "reconnect_backoff_max": 0.5,
}


def helper_settings(urls: list[str]) -> BusSettings:
    """Settings for a bus inside a helper process."""
    return BusSettings(redis_urls=tuple(urls), **FAST_SETTINGS)


def emit(**record: Any) -> None:
    """Print one JSON line for the test (helper side)."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class HelperProcess:
    """``python -m tests.support.<module> <args>``; its stdout is read as JSON lines."""

    def __init__(self, module: str, *args: str) -> None:
        self.module = module
        self.args = args
        self.process: asyncio.subprocess.Process | None = None
        self.records: list[dict[str, Any]] = []

    async def start(self) -> HelperProcess:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"tests.support.{self.module}",
            *self.args,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT / "core")},
        )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def read(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next JSON line; fails if none comes within ``timeout`` or the process ended."""
        assert self.process is not None and self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            raise AssertionError(f"{self.module} ended (exit code {self.process.returncode})")
        record: dict[str, Any] = json.loads(line)
        self.records.append(record)
        return record

    async def read_until(self, key: str, value: Any, timeout: float = 10.0) -> dict[str, Any]:
        """Read lines until one has ``record[key] == value``; returns it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            record = await self.read(max(deadline - loop.time(), 0.01))
            if record.get(key) == value:
                return record

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye."""
        if self.process is not None and self.process.returncode is None:
            os.kill(self.process.pid, signal.SIGKILL)

    async def wait(self, timeout: float = 10.0) -> int:
        assert self.process is not None
        return await asyncio.wait_for(self.process.wait(), timeout)

    async def stop(self) -> None:
        """Terminate (if still running) and reap the process."""
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
