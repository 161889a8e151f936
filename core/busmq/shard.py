"""One Redis deployment of the bus: its clients, its health, and the error boundary.

Every Redis call of the core goes through :meth:`Shard.run` (redis-py, for everything
but the hot paths) or :meth:`Shard.run_fast` (the shard's auto-pipelined connection,
:mod:`busmq.mux`, for push, read and ack). Both bound the call by the operation timeout
and translate client exceptions into busmq's. Nothing is resent behind the caller's
back: redis-py's own retries are off and the mux never resends, so only calls marked
idempotent are retried here, and only within the timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from .confirmed import ConfirmedWrites
from .durability import Durability, FsyncSupport, confirmation, fsync_support, shortfall
from .errors import (
    BusClosedError,
    BusError,
    BusTimeoutError,
    BusUnavailableError,
    DurabilityUnsupportedError,
    RedisCommandError,
)
from .events import Event, EventHub
from .mux import Endpoint, MuxClient, ReplyTimeoutError, was_not_sent
from .notifier import Notifier, WakeUps
from .redis_client import (
    CONNECTION_ERRORS,
    Redirect,
    gated,
    is_wrong_node,
    raw_reply,
    with_fast_packing,
)
from .sentinel import check_service, master_pool, sentinel_client
from .settings import BusSettings, mask_url
from .topology import SentinelTarget, is_cluster_url, is_sentinel_url, parse_sentinel_url

log = logging.getLogger(__name__)
T = TypeVar("T")
C = TypeVar("C")


class _Outage:
    """A call's way through an outage: while the shard is down (a failover, a restart),
    an idempotent call, or one not sent yet, waits up to ``failover_timeout`` from its
    start for the shard to come back, not just the operation timeout."""

    __slots__ = ("_deadline", "_scope")

    def __init__(self, scope: asyncio.Timeout, deadline: float) -> None:
        self._scope, self._deadline = scope, deadline

    def ride_out(self) -> None:
        when = self._scope.when()
        if when is not None and when < self._deadline:
            self._scope.reschedule(self._deadline)


class ShardState(enum.Enum):
    CONNECTING = "connecting"
    ONLINE = "online"
    OFFLINE = "offline"
    CLOSED = "closed"


def shard_identity(url: str) -> str:
    """A shard's identity for placement: its URL without credentials or query (for a
    Sentinel shard: its Sentinels and service name)."""
    if is_sentinel_url(url):
        return parse_sentinel_url(url).identity
    if is_cluster_url(url):
        return "cluster"  # a cluster is the bus's only shard
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    db = parts.path.strip("/") or "0"
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}/{db}"


class Shard:
    """A Redis deployment: its connection pool, hot-path connection, health monitor and
    notifier."""

    def __init__(self, url: str, settings: BusSettings, events: EventHub[Event]) -> None:
        self.url = url
        self.label = mask_url(url)
        self.identity = shard_identity(url)
        self._settings = settings
        self._events = events
        self.sentinel: SentinelTarget | None = None
        self._sentinel_client: Sentinel | None = None
        self.closing = False
        """Set while the bus closes: calls no longer wait out an outage (a process that
        stops does not hang for ``failover_timeout`` on each detach)."""
        self._client_calls: asyncio.Semaphore | None = None
        """Bounds the calls in flight on ``client`` where its pool raises rather than
        queues beyond ``max_connections`` (a cluster's nodes)."""
        self.client, endpoint = self._make_client()
        # Stream reads are decoded by busmq (message.decode_raw), not redis-py's callbacks.
        for command in ("XREAD", "XREADGROUP"):
            self.client.set_response_callback(command, raw_reply)
        # Push, read and ack share one auto-pipelined connection (see busmq.mux).
        self.mux = MuxClient(
            endpoint,
            reply_timeout=settings.operation_timeout,
            connect_timeout=settings.operation_timeout,
        )
        # Pushes that wait for replicas or an fsync (WAIT, WAITAOF) block the connection
        # they are sent on until confirmed: they get a connection of their own.
        self.durable_mux = MuxClient(
            endpoint,
            reply_timeout=settings.operation_timeout,
            connect_timeout=settings.operation_timeout,
        )
        self._confirmed = ConfirmedWrites(self.durable_mux)
        self._fsync_cache: dict[object, FsyncSupport] = {}  # per master address
        self.last_error: BaseException | None = None
        self._notifier = Notifier(
            endpoint,
            connect_timeout=settings.operation_timeout,
            retry_max=settings.reconnect_backoff_max,
            tick=settings.block_seconds,
        )
        self.notifier: WakeUps = self._notifier
        self._master: tuple[str, int] | None = None  # as the Sentinels named it last
        self.sharded_pubsub = False
        """Whether pushes announce themselves with ``SPUBLISH`` (a Redis 7 cluster)."""
        self.state = ShardState.CONNECTING
        self._online = asyncio.Event()
        self._serving = asyncio.Event()  # clear only while offline (see serving)
        self._serving.set()
        self._wake_monitor = asyncio.Event()
        self._monitor: asyncio.Task[None] | None = None

    def _make_client(self) -> tuple[Any, Endpoint]:
        """The redis-py client of this deployment, and the endpoint of busmq's own
        connections (the hot-path connection and the notifier)."""
        settings = self._settings
        # Commands never block in Redis (idle consumers wait on the notifier), so a
        # bounded pool serves any number of consumers; callers queue for a connection
        # within their operation timeout.
        if is_sentinel_url(self.url):
            self.sentinel = parse_sentinel_url(self.url)
            self._sentinel_client = sentinel_client(self.sentinel, settings.operation_timeout)
            pool: aioredis.ConnectionPool = master_pool(
                self.sentinel,
                self._sentinel_client,
                max_connections=settings.max_connections,
                connect_timeout=settings.operation_timeout,
            )
        else:
            pool = aioredis.BlockingConnectionPool.from_url(
                self.url,
                max_connections=settings.max_connections,
                timeout=None,
                retry=Retry(NoBackoff(), 0),
                socket_timeout=None,  # every call is bounded by Shard.run's asyncio.timeout
                socket_connect_timeout=settings.operation_timeout,
            )
        pool.connection_class = with_fast_packing(pool.connection_class)
        endpoint = Endpoint.from_pool(pool, self.label)
        if self.sentinel is not None:
            endpoint = dataclasses.replace(endpoint, locate=self._master_address)
        return aioredis.Redis(connection_pool=pool), endpoint

    # -- lifecycle ---------------------------------------------------------------------

    async def check_topology(self) -> None:
        """Fail fast on a deployment that is not what the URL says (:class:`TopologyError`):
        for now, a Sentinel service name no reachable Sentinel knows."""
        if self._sentinel_client is not None and self.sentinel is not None:
            await check_service(
                self._sentinel_client, self.sentinel, self._settings.operation_timeout
            )

    def start(self) -> None:
        self._monitor = asyncio.create_task(self._monitor_loop(), name=f"busmq-health {self.label}")

    @property
    def serving(self) -> asyncio.Event:
        """Clear while the shard is offline (a call or probe failed, and no probe got
        through since); set otherwise, a closed shard included."""
        return self._serving

    async def wait_online(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._online.wait()
            return True
        except TimeoutError:
            return False

    @property
    def operation_timeout(self) -> float:
        return self._settings.operation_timeout

    @property
    def closed(self) -> bool:
        return self.state is ShardState.CLOSED

    async def close(self) -> None:
        self._set_state(ShardState.CLOSED)
        if self._monitor is not None:
            # The monitor also stops on seeing CLOSED: a client library may turn the
            # cancellation of a probe into a connection error, which it survives.
            self._wake_monitor.set()
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        await self.notifier.close()
        await self.mux.aclose()
        await self.durable_mux.aclose()
        await self._close_client()

    async def _close_client(self) -> None:
        await self.client.aclose()
        await self.client.connection_pool.disconnect()
        if self._sentinel_client is not None:
            await self._sentinel_client.aclose()

    # -- health --------------------------------------------------------------------------

    async def _monitor_loop(self) -> None:
        backoff = 0.05
        while not self.closed:
            try:
                async with asyncio.timeout(self._settings.operation_timeout):
                    await self._probe()
            except (*CONNECTION_ERRORS, rex.ResponseError) as exc:
                self.report_failure(exc)
                delay = backoff * (0.5 + random.random() / 2)
                backoff = min(backoff * 2, self._settings.reconnect_backoff_max)
            else:
                backoff = 0.05
                if self.state is ShardState.OFFLINE:
                    await self._drop_idle_connections()
                self._set_state(ShardState.ONLINE)
                delay = self._settings.health_interval
            if self.closed:
                return
            self._wake_monitor.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._wake_monitor.wait()
            except TimeoutError:
                pass

    async def _probe(self) -> None:
        """One health check: raises a redis-py error if the deployment does not answer."""
        await self.client.ping()
        if self.sentinel is not None:
            await self._follow_master()

    async def _master_address(self) -> tuple[str, int]:
        """The master's address, from the Sentinels (redis-py's pool drops its idle
        connections when it changed)."""
        pool: Any = self.client.connection_pool
        host, port = await pool.get_master_address()
        return str(host), int(port)

    async def _follow_master(self) -> None:
        """Move the hot-path connections and the notifier to the master the Sentinels
        name now, if they are on another server (a demoted master still answers)."""
        master = await self._master_address()
        if self._master is not None and master != self._master:
            # A failover: consumers give back what they read ahead from the old master.
            log.warning(
                "redis shard %s: the Sentinels name a new master, %s:%s", self.label, *master
            )
            self._notifier.give_back_all()
        self._master = master
        for mux in (self.mux, self.durable_mux):
            address = mux.address
            if address is not None and address != master:
                log.warning("redis shard %s: master moved to %s:%s", self.label, *master)
                mux.drop("the master moved")
        self._notifier.follow(master)

    def _wrong_node(self, exc: BaseException) -> None:
        """A command reached a server that is no longer the master (``READONLY``, or a
        replica cut off from its master, ``MASTERDOWN``). Nothing was applied: drop the
        connections so the next call finds the new master."""
        self.report_failure(exc)
        for mux in (self.mux, self.durable_mux):
            mux.drop("the server is not the master")
        self._notifier.follow(None)

    async def _drop_idle_connections(self) -> None:
        """Close the pooled connections left from before an outage so calls reconnect.

        redis-py does not notice that an idle pooled connection was reset by a server
        that died (the reset does not read as EOF); reusing one after the server is back
        fails, and fails a non-idempotent push outright.
        """
        for client in (self.client,):
            try:
                await client.connection_pool.disconnect(inuse_connections=False)
            except Exception as exc:  # closing a dead socket; must not stop the monitor
                log.debug("dropping stale connections of %s: %s", self.label, exc)

    def report_failure(self, exc: BaseException) -> None:
        """Mark the shard offline after a failed call and have the monitor probe it now."""
        if self.state is ShardState.CLOSED:
            return
        self.last_error = exc
        if self.state is not ShardState.OFFLINE:
            log.warning("redis shard %s offline: %s: %s", self.label, type(exc).__name__, exc)
            self._events.emit(Event("error", self.label, error=exc))
        self._set_state(ShardState.OFFLINE)
        self._wake_monitor.set()

    def _set_state(self, state: ShardState) -> None:
        if state is self.state or self.state is ShardState.CLOSED:
            return  # a closed shard stays closed
        self.state = state
        if state is ShardState.ONLINE:
            self._online.set()
            log.info("redis shard %s online", self.label)
        else:
            self._online.clear()
        if state is ShardState.OFFLINE:
            self._serving.clear()
        else:
            self._serving.set()
        if state in (ShardState.ONLINE, ShardState.OFFLINE):
            self._events.emit(Event(state.value, self.label))

    # -- calls ---------------------------------------------------------------------------

    async def run(
        self,
        call: Callable[[aioredis.Redis], Awaitable[T]],
        *,
        idempotent: bool,
        timeout: float | None = None,
    ) -> T:
        """Run ``call(client)`` (redis-py) within the operation timeout, translating errors.

        While the shard is offline the call waits for it to come back (within the
        timeout) before it is sent. A call that fails on the connection is retried only
        if ``idempotent``; otherwise :class:`BusUnavailableError` is raised at once,
        since the command may have been applied.
        """
        budget = self._settings.operation_timeout if timeout is None else timeout
        gate = self._client_calls
        if gate is not None:
            call = gated(call, gate)
        return await self._bounded(call, lambda _: self.client, idempotent, budget)

    async def run_fast(
        self,
        call: Callable[[MuxClient], Awaitable[T]],
        *,
        idempotent: bool,
        route: str | None = None,
    ) -> T:
        """:meth:`run` for the hot paths, on the shard's auto-pipelined connection (in a
        cluster, that of the node holding the key ``route``).

        Same contract (operation timeout, errors, retries). The common case (shard
        online, connection up) takes no timer of its own: the connection drops itself
        when a reply is overdue, failing the call with a timeout.
        """
        budget = self._settings.operation_timeout
        mux = self._mux_for(route)
        redirect: Redirect | None = None
        if self.state is ShardState.ONLINE and mux.connected:
            started = time.monotonic()
            try:
                return await call(mux)
            except rex.ResponseError as exc:
                redirect = await self._redirect(exc)
                if redirect is None:
                    raise RedisCommandError(str(exc)) from exc
            except ReplyTimeoutError:
                raise self._timed_out(budget) from None
            except CONNECTION_ERRORS as exc:
                self.report_failure(exc)
                if not idempotent and not was_not_sent(exc):
                    raise BusUnavailableError(f"redis unreachable: {exc}", self.label) from exc
            except rex.RedisError as exc:  # refused by the client itself (e.g. DataError)
                raise RedisCommandError(f"redis client error: {exc}") from exc
            budget = max(0.0, budget - (time.monotonic() - started))
        return await self._bounded(
            call, lambda r: self._mux_for(route, r), idempotent, budget, redirect, asks=True
        )

    async def run_durable(
        self,
        sha: str,
        source: str,
        keys: list[str],
        args: list[Any],
        durability: Durability,
        *,
        route: str | None = None,
    ) -> tuple[Any, str | None]:
        """Run a writing script, then confirm it at ``durability`` on the same connection
        (``WAIT``, ``WAITAOF``). Returns the script's reply and, if the confirmation fell
        short within ``durability_timeout``, why (the write was applied all the same).
        Like :meth:`run_fast` with ``idempotent=False``: nothing is sent twice, except
        after a refusal that proves nothing was applied."""
        support = await self._fsync_support(route) if durability.fsync else None
        if support is not None and support.problem is not None:
            raise DurabilityUnsupportedError(f"fsync durability on {self.label}: {support.problem}")
        wait = self._settings.durability_wait
        confirm = confirmation(durability, support, wait)
        if confirm is None:  # the server fsyncs every write before it answers
            return await self.run_fast(
                lambda mux: mux.run_script(sha, source, keys, args), idempotent=False, route=route
            ), None
        reply, after = await self._bounded(
            lambda writes: writes.run_script(sha, source, keys, args, confirm),
            lambda _: self._confirmed_for(route),
            False,
            self._settings.operation_timeout,
        )
        return reply, shortfall(confirm, after, durability, wait)

    async def _fsync_support(self, route: str | None) -> FsyncSupport:
        """How the master holding ``route`` confirms an fsync, asked once per master (a
        failover may bring one configured otherwise)."""
        mux = self._mux_for(route)
        where = mux.address or self.url
        cached = self._fsync_cache.get(where)
        if cached is None:
            cached = await self.run_fast(fsync_support, idempotent=True, route=route)
            self._fsync_cache[where] = cached
        return cached

    # -- what a deployment kind changes (see busmq.cluster) -----------------------------

    def _mux_for(self, route: str | None, redirect: Redirect | None = None) -> MuxClient:
        """The hot-path connection for a call on the key ``route`` (after ``redirect``)."""
        return self.mux

    def _confirmed_for(self, route: str | None) -> ConfirmedWrites:
        """The durable-push connection for a call on the key ``route``."""
        return self._confirmed

    async def _redirect(self, exc: rex.ResponseError) -> Redirect | None:
        """Whether ``exc`` proves that the command was not applied because it reached
        the wrong server, having redirected the shard (``None``: a real error). Here:
        a server that is no longer the master (``READONLY``, ``MASTERDOWN``)."""
        if not is_wrong_node(exc):
            return None
        self._wrong_node(exc)
        return Redirect()

    # -- retries -------------------------------------------------------------------------

    async def _bounded(
        self,
        call: Callable[[C], Awaitable[T]],
        pick: Callable[[Redirect | None], C],
        idempotent: bool,
        budget: float,
        redirect: Redirect | None = None,
        *,
        asks: bool = False,
    ) -> T:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(budget) as scope:
                ride = 0.0 if self.closing else self._settings.failover_timeout
                outage = _Outage(scope, started + ride)
                return await self._run(call, pick, idempotent, redirect, asks, outage)
        except TimeoutError:
            raise self._timed_out(loop.time() - started) from None

    def _timed_out(self, budget: float) -> BusUnavailableError:
        if self.state is ShardState.OFFLINE:
            return BusUnavailableError(f"redis unreachable (waited {budget:.1f}s)", self.label)
        return BusTimeoutError(f"operation timed out after {budget:.1f}s", self.label)

    async def _run(
        self,
        call: Callable[[C], Awaitable[T]],
        pick: Callable[[Redirect | None], C],
        idempotent: bool,
        redirect: Redirect | None,
        asks: bool,
        outage: _Outage,
    ) -> T:
        """Call on ``pick(redirect)`` until it succeeds, fails for good, or may have been
        applied when it is not ``idempotent``. ``asks``: ``pick`` follows ``ASK``
        redirects (otherwise they are waited out like a failover)."""
        backoff = 0.02
        while True:
            if self.state is ShardState.CLOSED:
                raise BusClosedError("the bus is closed")
            if self.state is ShardState.OFFLINE:
                outage.ride_out()  # not sent yet: wait for the failover to end
                await self._online.wait()
            try:
                return await call(pick(redirect))
            except rex.ResponseError as exc:
                redirect = await self._redirect(exc)  # not applied: safe to send again
                if redirect is None:
                    raise RedisCommandError(str(exc)) from exc
                if redirect.ask is not None and not asks:
                    redirect = Redirect()
                if not redirect.pause:
                    continue
            except ReplyTimeoutError:
                raise TimeoutError from None  # as if the operation timeout ran out
            except CONNECTION_ERRORS as exc:
                self.report_failure(exc)
                if not idempotent and not was_not_sent(exc):
                    raise BusUnavailableError(f"redis unreachable: {exc}", self.label) from exc
                outage.ride_out()
                redirect = None
            except rex.RedisError as exc:  # refused by the client itself (e.g. DataError)
                raise RedisCommandError(f"redis client error: {exc}") from exc
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    def translate(self, exc: BaseException) -> BusError:
        """Turn a redis-py error raised outside :meth:`run` into a busmq error."""
        if isinstance(exc, CONNECTION_ERRORS):
            self.report_failure(exc)
            return BusUnavailableError(f"redis unreachable: {exc}", self.label)
        return BusError(f"redis error: {exc}")
