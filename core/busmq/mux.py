"""One auto-pipelined Redis connection per shard for the hot paths (push, read, ack).

redis-py spends 75-130 us of CPU per command on its per-command machinery (pool
checkout, timers and tasks, Python packing); on a 2-core machine that, not Redis, is
what limits a busmq process. Here every command issued in one event-loop iteration goes
out in one write, hiredis parses the replies in C, and replies are matched to their
callers in order: about 3.5 us per command when callers are concurrent, which is
busmq's normal case (one reader per consumer, one producer per queue). This works
because no busmq command blocks in Redis (idle consumers wait on the notifier), so one
connection can carry all of them.

What this module owns, and how:

- **Framing**: RESP2 (no ``HELLO``), parsed by ``hiredis.Reader``. Error replies come
  back as values, mapped to redis-py's exception classes by redis-py's own table
  (``NOSCRIPT`` -> ``NoScriptError``, ``LOADING`` -> ``BusyLoadingError``, ...), so the
  shard translates them exactly as it does redis-py's.
- **Connecting**: :class:`Endpoint` is read from the shard's redis-py pool, so every
  URL form the bus accepts (``redis://``, ``rediss://`` with the pool's SSL parameters,
  ``unix://``) reaches the same server the same way. A Sentinel shard's endpoint asks
  redis-py's Sentinel client for the master's address before every connect, so a new
  connection after a failover goes to the new master. The handshake is ``AUTH``
  (username and password, or password only), ``CLIENT SETNAME`` if the URL names the
  client, and ``SELECT``, pipelined in one write.
- **Failures**: when the connection is lost every pending call fails with a redis-py
  ``ConnectionError`` and the next call connects again. Nothing is ever sent twice: a
  push that may have been applied is the caller's to retry (with a ``request_id``).
- **Time**: no timer per call. One timer per connection, armed while replies are
  pending, drops the connection when the oldest pending reply is older than the reply
  timeout; the calls still pending then fail with :class:`ReplyTimeoutError`.
- **Cancellation**: a cancelled caller's reply is still read in its turn and dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import hiredis
import redis.exceptions as rex
from redis._parsers import BaseParser
from redis.asyncio.connection import (
    Connection,
    ConnectionPool,
    RedisSSLContext,
    SSLConnection,
    UnixDomainSocketConnection,
)

Arg = bytes | str | int | float | memoryview
Command = Sequence[Arg]
P = TypeVar("P", bound="RespProtocol")


DEFER_SECONDS = 0.02
"""Longest a deferred command waits for another call to ride with (:meth:`MuxClient.defer`)."""


class ReplyTimeoutError(rex.TimeoutError):
    """Redis did not answer within the reply timeout; the connection was dropped."""


def was_not_sent(exc: BaseException) -> bool:
    """Whether ``exc`` failed a call before its command was sent (no connection could be
    made): sending it again cannot apply it twice."""
    return getattr(exc, "_busmq_not_sent", False)


def _not_sent(exc: BaseException) -> BaseException:
    exc._busmq_not_sent = True  # type: ignore[attr-defined]  # read by was_not_sent
    return exc


def _reply_error(text: str) -> rex.RedisError:
    error: rex.RedisError = BaseParser.parse_error(text)  # type: ignore[no-untyped-call]
    return error


def _pack(command: Command) -> bytes:
    packed: bytes = hiredis.pack_command(tuple(command))  # type: ignore[arg-type]
    return packed


class RespProtocol(asyncio.Protocol):
    """One Redis connection: writes batched per loop iteration, replies in order.

    A request is one command (its future gets the reply) or several (the future gets
    the list of replies). Error replies are values (``redis.exceptions`` instances);
    a reply that arrives when no request is pending goes to :meth:`push_received`.
    """

    def __init__(self, label: str, reply_timeout: float) -> None:
        self.label = label
        self._loop = asyncio.get_running_loop()
        self._reader = hiredis.Reader(replyError=_reply_error)
        self._transport: asyncio.Transport | None = None
        # (future, number of replies or 0 for a single unwrapped one, time queued); no
        # future for deferred commands, whose replies nobody reads.
        self._pending: collections.deque[tuple[asyncio.Future[Any] | None, int, float]] = (
            collections.deque()
        )
        self._partial: list[Any] = []
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._reply_timeout = reply_timeout
        self._timer: asyncio.TimerHandle | None = None
        self._deferred: list[bytes] = []
        self._defer_timer: asyncio.TimerHandle | None = None
        self.error: rex.RedisError | None = None
        """Why the connection ended (``None`` while it is usable)."""
        self.address: tuple[str, int] | None = None
        """The server's TCP address (``None`` on a unix socket)."""
        self.ended: asyncio.Future[None] = self._loop.create_future()

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's do not subclass asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        pending = self._pending
        try:
            reply = reader.gets()
            while reply is not False:
                if not pending:
                    self.push_received(reply)
                    if self.error is not None:
                        return
                else:
                    future, count, _ = pending[0]
                    if not count:
                        pending.popleft()
                        if not future.done():  # type: ignore[union-attr]  # see defer
                            future.set_result(reply)  # type: ignore[union-attr]
                    else:
                        partial = self._partial
                        partial.append(reply)
                        if len(partial) == count:
                            pending.popleft()
                            self._partial = []
                            if future is not None and not future.done():
                                future.set_result(partial)
                reply = reader.gets()
        except hiredis.ProtocolError as exc:
            self.fail(rex.ConnectionError, f"protocol error from {self.label}: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        reason = exc or "closed by the server"
        self.fail(rex.ConnectionError, f"connection to {self.label} lost: {reason}")

    def push_received(self, reply: Any) -> None:
        """A reply nobody asked for: the stream is out of step, so drop the connection."""
        self.fail(rex.ConnectionError, f"unexpected reply from {self.label}: {reply!r:.100}")

    # -- requests ----------------------------------------------------------------------

    def request(self, command: Command) -> asyncio.Future[Any]:
        """Send one command; the future gets its reply."""
        return self._enqueue(_pack(command), 0)

    def request_many(self, commands: Sequence[Command]) -> asyncio.Future[list[Any]]:
        """Send commands back to back; the future gets their replies, in order."""
        return self._enqueue(b"".join([_pack(c) for c in commands]), len(commands))

    def write(self, command: Command) -> None:
        """Send a command whose replies arrive as pushes (pub/sub)."""
        if self.error is None:
            self._buffer(_pack(command))

    def defer(self, command: Command, delay: float) -> None:
        """Send ``command`` in the write of the next request, or after ``delay`` seconds if
        none comes first; its reply (or failure) is dropped. For clean-ups that need no
        write of their own (see :meth:`MuxClient.defer`)."""
        if self.error is not None:
            return
        self._deferred.append(_pack(command))
        if self._defer_timer is None:  # left armed when a request takes them: one a delay
            self._defer_timer = self._loop.call_later(delay, self._deferred_due)

    def _deferred_due(self) -> None:
        self._defer_timer = None
        if self._deferred:
            self.send_deferred(wait=False)

    def send_deferred(self, *, wait: bool) -> asyncio.Future[list[Any]] | None:
        """Send the deferred commands now; with ``wait``, a future done when Redis answered
        them all (``None`` if there were none)."""
        deferred, self._deferred = self._deferred, []
        if self.error is not None:
            return None
        if not deferred:
            # Some may be on their way already (sent by the timer or with a request):
            # replies come in order, so a PING's is the moment Redis applied them.
            if not wait or all(future is not None for future, _, _ in self._pending):
                return None
            deferred = [_pack((b"PING",))]
        future: asyncio.Future[list[Any]] | None = self._loop.create_future() if wait else None
        self._send(future, b"".join(deferred), len(deferred))
        return future

    def _enqueue(self, packed: bytes, count: int) -> asyncio.Future[Any]:
        if self.error is not None:
            raise type(self.error)(*self.error.args)
        if self._deferred:
            self.send_deferred(wait=False)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._send(future, packed, count)
        return future

    def _send(self, future: asyncio.Future[Any] | None, packed: bytes, count: int) -> None:
        self._pending.append((future, count, self._loop.time()))
        self._buffer(packed)
        if self._timer is None:
            self._arm_timer()

    def _buffer(self, packed: bytes) -> None:
        self._out.append(packed)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self._transport is not None and self.error is None:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    # -- deadline and end --------------------------------------------------------------

    def _arm_timer(self) -> None:
        deadline = self._pending[0][2] + self._reply_timeout
        self._timer = self._loop.call_at(deadline, self._check_overdue)

    def _check_overdue(self) -> None:
        self._timer = None
        if not self._pending:
            return
        if self._loop.time() - self._pending[0][2] >= self._reply_timeout:
            self.fail(
                ReplyTimeoutError,
                f"no reply from {self.label} within {self._reply_timeout:g}s; connection dropped",
            )
        else:
            self._arm_timer()

    def fail(self, kind: type[rex.RedisError], message: str) -> None:
        """End the connection: every pending call fails with ``kind(message)``."""
        if self.error is not None:
            return
        self.error = kind(message)
        if self._transport is not None:
            self._transport.abort()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._defer_timer is not None:
            self._defer_timer.cancel()
            self._defer_timer = None
        self._deferred = []
        pending, self._pending = self._pending, collections.deque()
        self._partial, self._out = [], []
        for future, _, _ in pending:
            if future is not None and not future.done():
                future.set_exception(kind(message))
        if not self.ended.done():
            self.ended.set_result(None)


@dataclass(frozen=True)
class Endpoint:
    """Where a shard's Redis is and how to log in, as its redis-py pool sees it."""

    label: str
    host: str = ""
    port: int = 6379
    path: str = ""
    tls: RedisSSLContext | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    client_name: str | None = None
    locate: Callable[[], Awaitable[tuple[str, int]]] | None = field(
        default=None, repr=False, compare=False
    )
    """Where the server is now (a Sentinel's answer), asked before each connect;
    ``None``: always ``host``/``port``."""

    @classmethod
    def from_pool(cls, pool: ConnectionPool, label: str) -> Endpoint:
        """The endpoint of ``pool``'s connections: redis-py parsed the URL (scheme,
        credentials, db, ``ssl_*`` and ``client_name`` query arguments) and holds the
        result in a connection object, which is never opened."""
        probe = pool.connection_class(**pool.connection_kwargs)
        common: dict[str, Any] = {
            "label": label,
            "db": int(probe.db or 0),
            "username": probe.username,
            "password": probe.password,
            "client_name": probe.client_name,
        }
        if isinstance(probe, UnixDomainSocketConnection):
            return cls(path=probe.path, **common)
        if not isinstance(probe, Connection):
            raise TypeError(f"unsupported redis-py connection class {type(probe).__name__}")
        tls = probe.ssl_context if isinstance(probe, SSLConnection) else None
        return cls(host=probe.host, port=int(probe.port), tls=tls, **common)

    def handshake(self, *, select: bool = True) -> list[Command]:
        """The commands that start a session, as redis-py sends them (in RESP2)."""
        commands: list[Command] = []
        if self.username or self.password:
            if self.username:
                commands.append((b"AUTH", self.username, self.password or ""))
            else:
                commands.append((b"AUTH", self.password or ""))
        if self.client_name:
            commands.append((b"CLIENT", b"SETNAME", self.client_name))
        if select and self.db:
            commands.append((b"SELECT", self.db))
        return commands

    async def connect(self, factory: Callable[[], P], timeout: float, *, select: bool = True) -> P:
        """Open a connection and run the handshake, all within ``timeout``. Failures
        are redis-py's ``ConnectionError`` (``AuthenticationError`` for a refused
        login) or ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                if self.path:
                    transport, protocol = await loop.create_unix_connection(factory, self.path)
                else:
                    host, port = (self.host, self.port)
                    if self.locate is not None:
                        host, port = await self.locate()
                    ssl = self.tls.get() if self.tls is not None else None
                    transport, protocol = await loop.create_connection(factory, host, port, ssl=ssl)
                    protocol.address = (host, int(port))
                try:
                    await self._start_session(protocol, select)
                except BaseException:
                    transport.abort()
                    raise
        except TimeoutError:
            raise rex.TimeoutError(
                f"connecting to {self.label}: no answer in {timeout:g}s"
            ) from None
        except OSError as exc:  # refused, unreachable, TLS errors, unreadable cert files
            raise rex.ConnectionError(f"connecting to {self.label}: {exc}") from exc
        return protocol

    async def _start_session(self, protocol: RespProtocol, select: bool) -> None:
        commands = self.handshake(select=select)
        if not commands:
            return
        replies = await protocol.request_many(commands)
        for command, reply in zip(commands, replies, strict=True):
            if isinstance(reply, rex.ConnectionError):  # AuthenticationError among them
                raise reply
            if isinstance(reply, rex.RedisError):
                name = command[0].decode() if isinstance(command[0], bytes) else command[0]
                raise rex.ConnectionError(f"{self.label}: {name} refused: {reply}")


class MuxClient:
    """What the hot paths get from :meth:`Shard.run_fast <busmq.shard.Shard.run_fast>`:
    one shared connection, opened on demand by the first call that needs it."""

    def __init__(self, endpoint: Endpoint, *, reply_timeout: float, connect_timeout: float) -> None:
        self.endpoint = endpoint
        self._reply_timeout = reply_timeout
        self._connect_timeout = connect_timeout
        self._protocol: RespProtocol | None = None
        self._connecting: asyncio.Task[RespProtocol] | None = None
        self._closed = False

    @property
    def connected(self) -> bool:
        """Whether a call would go out now, without connecting first."""
        protocol = self._protocol
        return protocol is not None and protocol.error is None

    async def _connection(self) -> RespProtocol:
        protocol = self._protocol
        if protocol is not None and protocol.error is None:
            return protocol
        if self._closed:
            raise _not_sent(rex.ConnectionError(f"connection to {self.endpoint.label} closed"))
        if self._connecting is None:
            # One attempt shared by every caller that needs it: if it fails they all
            # fail with its error, and the next call tries again.
            self._connecting = asyncio.create_task(self._connect())
            self._connecting.add_done_callback(_retrieve)
        try:
            return await asyncio.shield(self._connecting)
        except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
            # Raised again by every caller that shared the attempt: mark, not copy.
            raise _not_sent(exc) from None

    async def _connect(self) -> RespProtocol:
        label = self.endpoint.label
        try:
            protocol = await self.endpoint.connect(
                lambda: RespProtocol(label, self._reply_timeout), self._connect_timeout
            )
        finally:
            self._connecting = None
        if self._closed:
            protocol.fail(rex.ConnectionError, f"connection to {label} closed")
            raise rex.ConnectionError(f"connection to {label} closed")
        self._protocol = protocol
        return protocol

    async def execute(self, *command: Arg) -> Any:
        """Send one command; raise its error reply as redis-py would."""
        protocol = self._protocol
        if protocol is None or protocol.error is not None:
            protocol = await self._connection()
        reply = await protocol.request(command)
        if isinstance(reply, rex.RedisError):
            raise reply
        return reply

    async def execute_many(self, commands: Sequence[Command]) -> list[Any]:
        """Send commands back to back (not a transaction); error replies are returned
        in place as exception values, like redis-py's ``raise_on_error=False``."""
        protocol = self._protocol
        if protocol is None or protocol.error is not None:
            protocol = await self._connection()
        replies: list[Any] = await protocol.request_many(commands)
        return replies

    def defer(self, *command: Arg) -> None:
        """Send ``command`` with the next call on this connection, or within
        :data:`DEFER_SECONDS` if none comes, without waiting for its reply (an error reply
        or a lost connection is dropped). For clean-ups whose failure leaves nothing wrong,
        only something to tidy (an at-most-once read's ``XDEL``): under load they ride in
        another call's write instead of costing one of their own. Nothing is sent when not
        connected."""
        protocol = self._protocol
        if protocol is not None and protocol.error is None:
            protocol.defer(command, DEFER_SECONDS)

    async def flush_deferred(self) -> None:
        """Send what :meth:`defer` holds now and wait until Redis applied it (before a
        read that must see it, such as a queue's count)."""
        protocol = self._protocol
        if protocol is None or protocol.error is not None:
            return
        future = protocol.send_deferred(wait=True)
        if future is not None:
            future.add_done_callback(_ignore)  # its error matters to nobody
            with contextlib.suppress(rex.RedisError):
                await asyncio.shield(future)

    @property
    def address(self) -> tuple[str, int] | None:
        """The TCP address of the open connection, if any."""
        protocol = self._protocol
        return protocol.address if protocol is not None and protocol.error is None else None

    def drop(self, reason: str) -> None:
        """End the open connection (its pending calls fail with ``ConnectionError``); the
        next call connects again, to wherever the endpoint says the server is now."""
        if self._protocol is not None:
            self._protocol.fail(rex.ConnectionError, f"{self.endpoint.label}: {reason}")

    async def run_script(
        self, sha: str, source: Arg, keys: Sequence[Arg], args: Sequence[Arg]
    ) -> Any:
        """``EVALSHA``; on ``NOSCRIPT`` (the server lost its script cache, e.g. after a
        restart) load the script and run it again. NOSCRIPT means it did not run, so
        this never applies a call twice."""
        try:
            return await self.execute(b"EVALSHA", sha, len(keys), *keys, *args)
        except rex.NoScriptError:
            await self.execute(b"SCRIPT", b"LOAD", source)
            return await self.execute(b"EVALSHA", sha, len(keys), *keys, *args)

    async def aclose(self) -> None:
        """Close the connection; pending calls fail, later calls do not reconnect."""
        self._closed = True
        connecting = self._connecting
        if connecting is not None:
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
        if self._protocol is not None:
            self._protocol.fail(rex.ConnectionError, f"connection to {self.endpoint.label} closed")
            self._protocol = None


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shared connect attempt's error as seen (its callers may all have gone)."""
    if not task.cancelled():
        task.exception()
