"""A link to one target: a pool of warm HTTP/2 channels, credentials, and link state.

The link opens ``pool_size`` grpc.aio channels as soon as it starts and keeps them
connected (each channel's connectivity is watched and an idle one is asked to
reconnect), so the first call of a federated object does not wait for a handshake.
Calls and streams take channels round-robin.

A target may have several gateway URLs (``FederationTarget.fallback_urls``); the pool is
on one of them at a time (``link.current_url``, starting with the target's ``url``).

State machine::

    connecting ──probe ok──> ready <──outbox empty──> draining_outbox
        │                      │  (a call failed UNAVAILABLE, a channel failed)
        │                      v
        └──probe failed──> disconnected ──probe ok──> ready / draining_outbox
                    └──UNAUTHENTICATED──> unauthorized ──probe ok──> ready
    (any) ──close()──> closed

A probe is one authenticated ``GetQueue`` on a name that does not exist: ``NOT_FOUND``
proves the gateway is reachable, accepts the secret and reaches its Redis. Failed
probes are repeated after an exponential, jittered backoff (a wrong secret costs a
handful of calls, never a retry storm).

Failover (targets with several URLs): when a probe of the current URL fails for any
reason but refused credentials, the next probe (after the same backoff: one probe per
step, whatever the number of URLs) goes to the next URL, round-robin. That probe runs
on a fresh pool of channels to that URL; if it succeeds the pool is moved there: the
new channels are opened first, swapped in, and the old ones are closed after a grace
period (the longer of the operation and connect timeouts, plus a margin, so unary calls
under way on them end with their own status rather than be cancelled); streams still
open on them are then cancelled, and resume on the new URL. An ``UNAUTHENTICATED``
answer does not rotate (all URLs share the credentials, so it is a configuration error
reported by ``unauthorized``). The link is sticky: it stays on the URL that works and
does not return to the primary on its own.
With several URLs, probes do not wait for a channel that is failing to connect
(``wait_for_ready`` off), so a dead URL is left within a backoff step instead of after
``connect_timeout``; with one URL probes wait as before.

Events (``link.events``, source = the target's ``url``): ``state`` (details ``state``,
``previous``, ``url`` = the current URL) on every change, ``ready`` when the link
becomes usable, ``unauthorized`` when the gateway refuses the credentials, ``error``
for each failed probe (with the exception; details ``url`` = the URL probed),
``failover`` when the pool moved to another URL (details ``from``, ``to``), ``closed``
when the link is closed.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Callable
from typing import Any

import grpc

from ..errors import BusClosedError, BusError, BusUnavailableError
from ..events import Event, EventHub
from ..security import plaintext_warning
from ..v1 import queue_service_pb2 as pb
from ..v1 import queue_service_pb2_grpc as pb_grpc
from .backoff import Backoff
from .errors import RETRYABLE, UNAUTHORIZED, FederationUnauthorizedError, from_rpc_error
from .pushes import PushCoalescer
from .retries import channel_options
from .settings import FederationSettings, FederationTarget, grpc_address

log = logging.getLogger(__name__)

PROBE_QUEUE = "busmq.federation.probe"
MAX_GRPC_MESSAGE = 64 * 1024 * 1024
RETIRE_MARGIN = 1.0  # seconds a retired pool outlives the deadlines of its calls
DEADLINE_GUARD = 1.0  # seconds past a unary call's deadline before it is cancelled here


class LinkState(enum.Enum):
    """Where a link stands; ``usable`` states accept direct calls."""

    CONNECTING = "connecting"
    READY = "ready"
    DRAINING_OUTBOX = "draining_outbox"
    DISCONNECTED = "disconnected"
    UNAUTHORIZED = "unauthorized"
    CLOSED = "closed"

    @property
    def usable(self) -> bool:
        return self in (LinkState.READY, LinkState.DRAINING_OUTBOX)


class Link:
    """The connection of this bus to one target (see the module docstring).

    Attributes:
        url: the target's URL (normalized), its identity; see ``current_url`` for the
            gateway URL in use.
        events: the link's :class:`~busmq.events.EventHub`.
        attempts: probes made so far (each is one call to a gateway).
        failovers: times the pool moved to another URL.
    """

    def __init__(
        self,
        target: FederationTarget,
        settings: FederationSettings,
        *,
        operation_timeout: float,
        outbox_messages: Callable[[], int] = lambda: 0,
        outbox_rows: Callable[[], int] = lambda: 0,
    ) -> None:
        self.target = target
        self.url = target.url
        self.settings = settings
        self.operation_timeout = operation_timeout
        if target.plaintext_off_loopback:  # only with allow_plaintext (else refused)
            log.warning(plaintext_warning(f"the link to {target.url}"))
        self.events: EventHub[Event] = EventHub()
        self.attempts = 0
        self.failovers = 0
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {target.secret}"),) if target.secret else ()
        )
        self._outbox_messages = outbox_messages
        self._outbox_rows = outbox_rows
        self._state = LinkState.CONNECTING
        self._usable = asyncio.Event()
        self._settled = asyncio.Event()  # the first probe has an outcome
        self._trouble = asyncio.Event()
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[dict[type[Any], Any]] = []  # per channel, by stub class
        self._round_robin = itertools.count()
        self._current = 0  # index in target.urls of the URL the pool is on
        self._next = 0  # index of the URL the next probe goes to
        self._supervisor: asyncio.Task[None] | None = None
        self._watchers: list[asyncio.Task[None]] = []
        # Pools left by a failover, closed after a grace period (see _retire).
        self._retiring: dict[asyncio.Task[None], list[grpc.aio.Channel]] = {}
        self.pushes = PushCoalescer(self)
        """The direct pushes of every federated queue of this link, coalesced."""

    def __repr__(self) -> str:
        via = f" via {self.current_url}" if self._current else ""
        return f"<Link {self.url}{via} {self._state.value} outbox={self.outbox_depth}>"

    # -- state ----------------------------------------------------------------------

    @property
    def state(self) -> LinkState:
        return self._state

    @property
    def current_url(self) -> str:
        """The gateway URL the channel pool is on (the target's ``url`` until a
        failover)."""
        return self.target.urls[self._current]

    @property
    def usable(self) -> bool:
        """Whether direct calls are expected to work (``ready`` or ``draining_outbox``)."""
        return self._state.usable

    @property
    def outbox_depth(self) -> int:
        """Messages waiting in the outbox for this gateway."""
        return self._outbox_messages()

    @property
    def outbox_rows(self) -> int:
        """Pushes (outbox rows) waiting for this gateway."""
        return self._outbox_rows()

    async def wait_usable(self, timeout: float | None = None) -> bool:
        """Wait until the link is usable; False after ``timeout`` seconds or if closed."""
        if self._state is LinkState.CLOSED:
            return False
        try:
            async with asyncio.timeout(timeout):
                await self._usable.wait()
        except TimeoutError:
            return False
        return self._state.usable

    async def wait_settled(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for the first probe after start to have an outcome."""
        try:
            async with asyncio.timeout(timeout):
                await self._settled.wait()
        except TimeoutError:
            pass

    def report(self, error: grpc.aio.AioRpcError) -> None:
        """Called by users of the link when a call failed: a transport-level failure
        makes the link re-probe; a refusal of the credentials marks it unauthorized."""
        self.report_code(error.code())

    def report_code(self, code: grpc.StatusCode) -> None:
        """:meth:`report` for a failure known by its code alone (one push of a
        ``PushMany``, which fails like a whole ``Push`` would)."""
        if code in UNAUTHORIZED:
            if self._state is not LinkState.UNAUTHORIZED:
                self._set_state(LinkState.UNAUTHORIZED)
                self.events.emit(Event("unauthorized", self.url))
            self._trouble.set()
        elif code in RETRYABLE:
            self._trouble.set()

    def note_outbox(self) -> None:
        """The outbox changed: switch between ``ready`` and ``draining_outbox``."""
        if self._state.usable:
            rows = self._outbox_rows()
            self._set_state(LinkState.DRAINING_OUTBOX if rows else LinkState.READY)

    def require_authorized(self) -> None:
        """Raise while the gateway refuses the credentials, or once the link is closed."""
        if self._state is LinkState.UNAUTHORIZED:
            raise FederationUnauthorizedError(self.url)
        if self._state is LinkState.CLOSED:
            raise BusClosedError(f"the link to {self.url} is closed")

    async def require_usable(self, note: str = "") -> None:
        """Fail fast unless direct calls are expected to work (for calls that are not
        queued in the outbox); a link still connecting gets its first probe's outcome
        (up to ``connect_timeout``) first.

        Raises:
            BusClosedError: the link is closed.
            FederationUnauthorizedError: the gateway refuses the credentials.
            BusUnavailableError: the link is down (``note`` is added to the message).
        """
        if self._state is LinkState.CONNECTING:
            await self.wait_settled(self.settings.connect_timeout)
        self.require_authorized()
        if not self.usable:
            raise BusUnavailableError(f"the link is {self._state.value}{note}", self.url)

    def _set_state(self, state: LinkState) -> None:
        previous = self._state
        if state is previous or previous is LinkState.CLOSED:
            return
        self._state = state
        if state.usable:
            self._usable.set()
        else:
            self._usable.clear()
        log.info(
            "federation link %s: %s -> %s (via %s)",
            self.url,
            previous.value,
            state.value,
            self.current_url,
        )
        details = {"state": state.value, "previous": previous.value, "url": self.current_url}
        self.events.emit(Event("state", self.url, details=details))
        if state.usable and not previous.usable:
            self.pushes.retry_push_many()
            self.events.emit(Event("ready", self.url))

    # -- channels -------------------------------------------------------------------

    def stub(self, kind: type[Any] | None = None) -> Any:
        """A stub of service ``kind`` (a generated ``...Stub`` class; default
        ``QueueServiceStub``) on the next channel of the pool, round-robin, preferring
        a connected channel: after a cut, channels reconnect one by one."""
        count = len(self._channels)
        if not count:
            raise BusError(f"the link to {self.url} is not started or closed")
        start = next(self._round_robin)
        index = start % count
        for i in range(count):
            candidate = (start + i) % count
            if self._channels[candidate].get_state() is grpc.ChannelConnectivity.READY:
                index = candidate
                break
        stubs = self._stubs[index]
        kind = kind or pb_grpc.QueueServiceStub
        stub = stubs.get(kind)
        if stub is None:
            stub = stubs[kind] = kind(self._channels[index])
        return stub

    async def call(
        self, method: str, request: Any, *, kind: type[Any] | None = None, wait: bool = False
    ) -> Any:
        """One unary call of service ``kind`` (see :meth:`stub`) with the link's
        credentials and operation timeout; ``wait``: wait for a connected channel within
        it (``wait_for_ready``) rather than fail fast. A failure is reported to the link
        and raised as the ``grpc.aio.AioRpcError``, for the caller to map.

        The call's own deadline is not relied on alone: with a retry policy (the calls of
        :mod:`.retries`), gRPC's C core can leave a call hanging past its deadline when
        a retry's timer races it (grpc/grpc#41036, seen here behind a balancer while a
        gateway restarts: an ack that never returned stopped a consumer's loop). A call
        not over ``DEADLINE_GUARD`` seconds after its deadline is cancelled and fails
        ``DEADLINE_EXCEEDED`` like one the deadline ended."""
        call = getattr(self.stub(kind), method)(
            request, metadata=self.metadata, timeout=self.operation_timeout, wait_for_ready=wait
        )
        try:
            async with asyncio.timeout(self.operation_timeout + DEADLINE_GUARD):
                return await call
        except TimeoutError:
            call.cancel()
            exc = grpc.aio.AioRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                f"{method}: no answer within {self.operation_timeout:g} s",
            )
            self.report(exc)
            raise exc from None
        except grpc.aio.AioRpcError as exc:
            self.report(exc)
            raise

    def _options(self) -> list[tuple[str, Any]]:
        target, settings = self.target, self.settings
        backoff_ms = int(settings.reconnect_backoff_initial * 1000)
        options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", int(target.keepalive_seconds * 1000)),
            ("grpc.keepalive_timeout_ms", int(target.keepalive_timeout_seconds * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # gRPC's own reconnect backoff defaults to 1 s growing to 120 s; a link that
            # was cut must come back within our backoff bounds instead.
            ("grpc.initial_reconnect_backoff_ms", backoff_ms),
            ("grpc.min_reconnect_backoff_ms", backoff_ms),
            ("grpc.max_reconnect_backoff_ms", int(settings.reconnect_backoff_max * 1000)),
            # Without this, channels with equal arguments share one connection.
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
            *channel_options(),  # what is safe to repeat, on another gateway
        ]
        if target.server_name:
            options.append(("grpc.ssl_target_name_override", target.server_name))
        return options

    def _open_channel(self, url: str) -> grpc.aio.Channel:
        address = grpc_address(url)
        if not self.target.tls:
            return grpc.aio.insecure_channel(address, options=self._options())
        root, key, chain = self.target.read_credentials()
        credentials = grpc.ssl_channel_credentials(
            root_certificates=root, private_key=key, certificate_chain=chain
        )
        return grpc.aio.secure_channel(address, credentials, options=self._options())

    def _open_pool(self, url: str) -> list[grpc.aio.Channel]:
        return [self._open_channel(url) for _ in range(self.target.pool_size)]

    def _use_pool(self, channels: list[grpc.aio.Channel]) -> None:
        """Make ``channels`` the pool, with a watcher each."""
        self._channels = channels
        self._stubs = [{} for _ in channels]
        name = f"busmq-link {self.url} channel"
        self._watchers = [
            asyncio.create_task(self._watch(channel), name=f"{name} {i}")
            for i, channel in enumerate(channels)
        ]

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Open the channel pool and start probing (needs a running event loop)."""
        if self._channels or self._state is LinkState.CLOSED:
            return
        self._use_pool(self._open_pool(self.current_url))
        self._supervisor = asyncio.create_task(self._supervise(), name=f"busmq-link {self.url}")

    async def close(self) -> None:
        if self._state is LinkState.CLOSED:
            return
        retired = [channel for pool in self._retiring.values() for channel in pool]
        tasks = [*self._watchers, *self._retiring]
        if self._supervisor is not None:
            tasks.append(self._supervisor)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.pushes.close()
        self._set_state(LinkState.CLOSED)
        self._usable.set()  # wake waiters; they see CLOSED
        self._settled.set()
        channels, self._channels, self._stubs = self._channels + retired, [], []
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        self.events.emit(Event("closed", self.url))
        self.events.close()

    # -- supervision ----------------------------------------------------------------

    async def _supervise(self) -> None:
        backoff = Backoff(
            self.settings.reconnect_backoff_initial, self.settings.reconnect_backoff_max
        )
        urls = self.target.urls
        while True:
            url = urls[self._next]
            if self._next == self._current:
                error = await self._probe(self.stub())
            else:
                error = await self._probe_other(self._next)
            self._settled.set()
            if error is None:
                # Failures reported while the probe ran are older than its success.
                self._trouble.clear()
                backoff.reset()
                rows = self._outbox_rows()
                self._set_state(LinkState.DRAINING_OUTBOX if rows else LinkState.READY)
                await self._trouble.wait()
                if self._state is not LinkState.UNAUTHORIZED:
                    self._set_state(LinkState.DISCONNECTED)
                continue  # probe at once: the connection may simply be re-established
            details = {"url": url}
            if isinstance(error, FederationUnauthorizedError):
                # Reachable, but the credentials (shared by every URL) are refused:
                # stay on this URL, as with a single one.
                if self._state is not LinkState.UNAUTHORIZED:
                    self._set_state(LinkState.UNAUTHORIZED)
                    self.events.emit(Event("unauthorized", self.url, error=error, details=details))
            else:
                self._set_state(LinkState.DISCONNECTED)
                self._next = (self._next + 1) % len(urls)
            self.events.emit(Event("error", self.url, error=error, details=details))
            await asyncio.sleep(backoff.next())

    async def _probe(self, stub: Any) -> BusError | None:
        """One authenticated call through ``stub``; None if the gateway answered as
        expected."""
        self.attempts += 1
        try:
            await stub.GetQueue(
                pb.GetQueueRequest(queue=PROBE_QUEUE),
                metadata=self.metadata,
                timeout=self.settings.connect_timeout,
                # With fallbacks, a URL that cannot be connected to fails the probe at
                # once, so that the next probe tries the next URL.
                wait_for_ready=not self.target.fallback_urls,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return None
            return from_rpc_error(exc, queue=PROBE_QUEUE, target=self.url)
        return None

    async def _probe_other(self, index: int) -> BusError | None:
        """Probe URL ``index`` (not the current one) on a pool of fresh channels, and
        move the link onto that pool if the probe succeeds."""
        channels = self._open_pool(self.target.urls[index])
        moved = False
        try:
            for channel in channels:
                channel.get_state(try_to_connect=True)
            stub_class: type[Any] = pb_grpc.QueueServiceStub  # generated, untyped
            error = await self._probe(stub_class(channels[0]))
            if error is None:
                await self._warm_up(channels[1:])
                self._move(index, channels)
                moved = True
            return error
        finally:
            if not moved:  # nobody else has used these channels
                await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)

    async def _warm_up(self, channels: list[grpc.aio.Channel]) -> None:
        """Give the rest of a new pool (its first channel is connected) a bounded
        moment to connect, so that resuming streams spread over the pool."""
        if not channels:
            return
        try:
            async with asyncio.timeout(self.settings.connect_timeout):
                await asyncio.gather(*(c.channel_ready() for c in channels))
        except TimeoutError:
            pass  # their watchers keep them connecting; calls prefer ready channels

    def _move(self, index: int, channels: list[grpc.aio.Channel]) -> None:
        """Swap the pool for ``channels`` (to URL ``index``), and retire the old one."""
        old_url, old_channels = self.current_url, self._channels
        for task in self._watchers:
            task.cancel()
        self._current = index
        self._use_pool(channels)
        self.failovers += 1
        retire = asyncio.create_task(
            self._retire(old_channels), name=f"busmq-link {self.url} retire {old_url}"
        )
        self._retiring[retire] = old_channels
        retire.add_done_callback(self._retired)
        log.warning(
            "federation link %s: failed over from %s to %s", self.url, old_url, self.current_url
        )
        details = {"from": old_url, "to": self.current_url}
        self.events.emit(Event("failover", self.url, details=details))

    async def _retire(self, channels: list[grpc.aio.Channel]) -> None:
        """Close a pool that calls no longer go to, once the calls under way on it have
        had time to end with their own status: each has a deadline of at most the
        longer of the two timeouts, plus a margin. (Closing a channel cancels its calls,
        which their callers would see as ``asyncio.CancelledError``.) What is left then
        is streams; they are cancelled and resume on the new pool."""
        grace = max(self.operation_timeout, self.settings.connect_timeout) + RETIRE_MARGIN
        await asyncio.sleep(grace)
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)

    def _retired(self, task: asyncio.Task[None]) -> None:
        self._retiring.pop(task, None)

    async def _watch(self, channel: grpc.aio.Channel) -> None:
        """Keep one channel connected, and notice when its connection fails."""
        state = channel.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.SHUTDOWN:
            await channel.wait_for_state_change(state)
            # try_to_connect: an IDLE channel (its connection was closed) reconnects at
            # once instead of on the next call, so the pool stays warm.
            state = channel.get_state(try_to_connect=True)
            if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE and not self._any_ready():
                self._trouble.set()

    def _any_ready(self) -> bool:
        ready = grpc.ChannelConnectivity.READY
        return any(channel.get_state() is ready for channel in self._channels)
