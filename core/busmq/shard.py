"""One Redis deployment of the bus: its clients, its health, and the error boundary.

Every Redis call of the core goes through :meth:`Shard.run`, which bounds it by the
operation timeout and translates redis-py exceptions into busmq's. redis-py's own
retries are switched off: a push must never be resent behind the caller's back, so
only calls marked idempotent are retried here, and only within the timeout.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .errors import (
    BusClosedError,
    BusError,
    BusTimeoutError,
    BusUnavailableError,
    RedisCommandError,
)
from .events import Event, EventHub
from .settings import BusSettings, mask_url

log = logging.getLogger(__name__)
T = TypeVar("T")

CONNECTION_ERRORS = (rex.ConnectionError, rex.TimeoutError, OSError)


class ShardState(enum.Enum):
    CONNECTING = "connecting"
    ONLINE = "online"
    OFFLINE = "offline"
    CLOSED = "closed"


def shard_identity(url: str) -> str:
    """A shard's identity for placement: its URL without credentials or query."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    db = parts.path.strip("/") or "0"
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}/{db}"


class Shard:
    """A Redis deployment with a client for commands and one for blocking reads."""

    def __init__(self, url: str, settings: BusSettings, events: EventHub[Event]) -> None:
        self.url = url
        self.label = mask_url(url)
        self.identity = shard_identity(url)
        self._settings = settings
        self._events = events
        no_retry = Retry(NoBackoff(), 0)
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            retry=no_retry,
            socket_timeout=settings.operation_timeout,
            socket_connect_timeout=settings.operation_timeout,
        )
        # Blocking reads hold a connection for up to block_seconds; a separate pool keeps
        # them from starving ordinary commands.
        self.blocking: aioredis.Redis = aioredis.Redis.from_url(
            url,
            retry=no_retry,
            socket_timeout=settings.block_seconds + settings.operation_timeout,
            socket_connect_timeout=settings.operation_timeout,
        )
        self.state = ShardState.CONNECTING
        self._online = asyncio.Event()
        self._wake_monitor = asyncio.Event()
        self._monitor: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._monitor = asyncio.create_task(self._monitor_loop(), name=f"busmq-health {self.label}")

    async def wait_online(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._online.wait()
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        self._set_state(ShardState.CLOSED)
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        await self.client.aclose()
        await self.blocking.aclose()

    # -- health --------------------------------------------------------------------------

    async def _monitor_loop(self) -> None:
        backoff = 0.05
        while True:
            try:
                async with asyncio.timeout(self._settings.operation_timeout):
                    await self.client.ping()
            except (*CONNECTION_ERRORS, rex.ResponseError) as exc:
                self.report_failure(exc)
                delay = backoff * (0.5 + random.random() / 2)
                backoff = min(backoff * 2, self._settings.reconnect_backoff_max)
            else:
                backoff = 0.05
                self._set_state(ShardState.ONLINE)
                delay = self._settings.health_interval
            self._wake_monitor.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._wake_monitor.wait()
            except TimeoutError:
                pass

    def report_failure(self, exc: BaseException) -> None:
        """Mark the shard offline after a failed call and have the monitor probe it now."""
        if self.state is ShardState.CLOSED:
            return
        if self.state is not ShardState.OFFLINE:
            log.warning("redis shard %s offline: %s", self.label, exc)
            self._events.emit(Event("error", self.label, error=exc))
        self._set_state(ShardState.OFFLINE)
        self._wake_monitor.set()

    def _set_state(self, state: ShardState) -> None:
        if state is self.state:
            return
        self.state = state
        if state is ShardState.ONLINE:
            self._online.set()
            log.info("redis shard %s online", self.label)
        else:
            self._online.clear()
        if state in (ShardState.ONLINE, ShardState.OFFLINE):
            self._events.emit(Event(state.value, self.label))

    # -- calls ---------------------------------------------------------------------------

    async def run(
        self,
        call: Callable[[aioredis.Redis], Awaitable[T]],
        *,
        idempotent: bool,
        blocking: bool = False,
        timeout: float | None = None,
    ) -> T:
        """Run ``call(client)`` within the operation timeout, translating errors.

        While the shard is offline the call waits for it to come back (within the
        timeout) before it is sent. A call that fails on the connection is retried only
        if ``idempotent``; otherwise :class:`BusUnavailableError` is raised at once,
        since the command may have been applied.
        """
        budget = self._settings.operation_timeout if timeout is None else timeout
        if blocking:
            budget += self._settings.block_seconds
        client = self.blocking if blocking else self.client
        try:
            async with asyncio.timeout(budget):
                return await self._run(call, client, idempotent)
        except TimeoutError:
            if self.state is ShardState.OFFLINE:
                raise BusUnavailableError(
                    f"redis unreachable (waited {budget:.1f}s)", self.label
                ) from None
            raise BusTimeoutError(f"operation timed out after {budget:.1f}s", self.label) from None

    async def _run(
        self,
        call: Callable[[aioredis.Redis], Awaitable[T]],
        client: aioredis.Redis,
        idempotent: bool,
    ) -> T:
        backoff = 0.02
        while True:
            if self.state is ShardState.CLOSED:
                raise BusClosedError("the bus is closed")
            if self.state is ShardState.OFFLINE:
                await self._online.wait()
            try:
                return await call(client)
            except rex.ResponseError as exc:
                raise RedisCommandError(str(exc)) from exc
            except CONNECTION_ERRORS as exc:
                self.report_failure(exc)
                if not idempotent:
                    raise BusUnavailableError(f"redis unreachable: {exc}", self.label) from exc
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.5)

    def translate(self, exc: BaseException) -> BusError:
        """Turn a redis-py error raised outside :meth:`run` into a busmq error."""
        if isinstance(exc, CONNECTION_ERRORS):
            self.report_failure(exc)
            return BusUnavailableError(f"redis unreachable: {exc}", self.label)
        return BusError(f"redis error: {exc}")
