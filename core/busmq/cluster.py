"""A Redis Cluster as the bus's one shard: the cluster's slots place the queues.

Every key of a queue carries the queue's name as a ``{hash tag}`` (see
:mod:`busmq.keys`), so a queue lives in one slot and its scripts are single-slot.

- **Discovery and the slot map** are redis-py's (``redis.asyncio.cluster.RedisCluster``
  and its nodes manager, from ``CLUSTER SLOTS``); the redis-py client also serves the
  calls that are not on the hot path, following ``MOVED``/``ASK`` itself.
- **The hot paths** (push, read, ack) go over one auto-pipelined connection per master
  (:mod:`busmq.mux`), chosen by the slot of the call's key. A command refused with
  ``MOVED`` updates the slot map and goes again to the new owner; ``ASK`` (a slot being
  migrated) sends it once to the target, preceded by ``ASKING``; ``TRYAGAIN`` (a
  multi-key command while the slot's keys are split between two nodes) waits a moment
  and sends it again. All three prove the command was not applied, so even a push is
  sent again. A lost connection fails the calls pending on it (a push raises
  ``BusUnavailableError``: it may have been applied) and makes the health probe read
  the topology again, which after a failover names the promoted replica.
- **Durable pushes** wait (``WAIT``/``WAITAOF``) on the master that took them.
- **Wake-ups** (:class:`ClusterNotifier`): on Redis 7+ the push script announces itself
  with ``SPUBLISH`` on the queue's sharded channel, which lives in the queue's slot, and
  each consumer's channel is watched (``SSUBSCRIBE``) on the node serving that slot, so
  a notification travels from that node to its watchers only. After a slot move or a
  failover (seen by the health probe's topology read) the watched channels move to
  their new node, and after a failover their consumers give back what they read ahead
  (as on a Sentinel failover); meanwhile the notifier's tick still wakes every consumer. On older
  servers plain ``PUBLISH`` is forwarded to every node, and the same per-node watching
  works unchanged.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import re
from collections.abc import Sequence
from typing import Any

import redis.exceptions as rex
from redis.asyncio import ConnectionPool
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot

from .confirmed import ConfirmedWrites
from .errors import TopologyError
from .keys import QueueKeys
from .mux import Arg, Command, Endpoint, MuxClient
from .notifier import Notifier, WakeUp, mark_give_back, mark_recheck
from .redis_client import CONNECTION_ERRORS, Redirect, is_wrong_node
from .shard import Shard
from .topology import ClusterTarget, parse_cluster_url, ssl_kwargs

log = logging.getLogger(__name__)
_NOT_A_CLUSTER = "Cluster mode is not enabled"


class _Node:
    """busmq's own connections to one master of the cluster."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        self.mux = MuxClient(endpoint, reply_timeout=timeout, connect_timeout=timeout)
        self.durable_mux = MuxClient(endpoint, reply_timeout=timeout, connect_timeout=timeout)
        self.confirmed = ConfirmedWrites(self.durable_mux)

    async def aclose(self) -> None:
        await self.mux.aclose()
        await self.durable_mux.aclose()


class _AskingMux(MuxClient):
    """A node's connection for one redirected call: every command goes out right
    behind an ``ASKING`` (in the same write, so no other caller's command slips in)."""

    def __init__(self, base: MuxClient) -> None:  # shares the base's connection
        self._base = base
        self.endpoint = base.endpoint

    @property
    def connected(self) -> bool:
        return self._base.connected

    async def execute(self, *command: Arg) -> Any:
        _, reply = await self._base.execute_many([(b"ASKING",), command])
        if isinstance(reply, rex.RedisError):
            raise reply
        return reply

    async def execute_many(self, commands: Sequence[Command]) -> list[Any]:
        interleaved: list[Command] = []
        for command in commands:
            interleaved += [(b"ASKING",), command]
        replies = await self._base.execute_many(interleaved)
        return replies[1::2]


class ClusterNotifier:
    """Wake-ups of a cluster's consumers: a :class:`~busmq.notifier.Notifier` per node,
    each watching the channels of the slots that node serves."""

    def __init__(self, shard: ClusterShard) -> None:
        self._shard = shard
        self.tick = shard._settings.block_seconds
        self._notifiers: dict[tuple[str, int], Notifier] = {}
        self._homes: dict[bytes, tuple[str, int]] = {}  # channel -> node watching it

    def _notifier(self, address: tuple[str, int]) -> Notifier:
        notifier = self._notifiers.get(address)
        if notifier is None:
            settings = self._shard._settings
            notifier = self._notifiers[address] = Notifier(
                self._shard._endpoint(*address),
                connect_timeout=settings.operation_timeout,
                retry_max=settings.reconnect_backoff_max,
                tick=settings.block_seconds,
                sharded=self._shard.sharded_pubsub,
            )
        return notifier

    async def watch(self, queue: str) -> WakeUp:
        channel = QueueKeys(queue).notify_channel.encode()
        address = self._homes.get(channel) or self._shard.node_of(channel)
        self._homes[channel] = address
        wake = WakeUp()
        await self._notifier(address).adopt(channel, wake)
        return wake

    def nudge(self, channel: bytes) -> None:
        address = self._homes.get(channel)
        if address is not None:
            self._notifiers[address].nudge(channel)

    def node_watching(self, queue: str) -> tuple[str, int] | None:
        """The node on which ``queue``'s wake-ups are watched, if they are."""
        return self._homes.get(QueueKeys(queue).notify_channel.encode())

    async def unwatch(self, queue: str, event: asyncio.Event) -> None:
        channel = QueueKeys(queue).notify_channel.encode()
        address = self._homes.get(channel)
        if address is None:
            return
        notifier = self._notifiers[address]
        await notifier.unwatch(queue, event)
        if channel not in notifier.channels():
            del self._homes[channel]

    async def follow_slots(self) -> None:
        """Move every watched channel to the node that serves its slot now. Where the
        node that served it is no master any more (a failover promoted its replica),
        the consumers give back their read-ahead, as on a Sentinel failover; a slot
        migrated between two masters only makes them read once."""
        masters = {(m.host, int(m.port)) for m in self._shard.client.get_primaries()}
        for channel, address in list(self._homes.items()):
            try:
                owner = self._shard.node_of(channel)
            except rex.ConnectionError:
                return  # no slot map right now: the next probe tries again
            if owner == address:
                continue
            events = self._notifiers[address].release(channel)
            self._homes[channel] = owner
            for event in events:
                await self._notifier(owner).adopt(channel, event)
            if address in masters:  # publications may have gone unseen meanwhile: read once
                mark_recheck(events)
            else:  # the promoted replica may not have seen the reads of the read-ahead
                mark_give_back(events)

    async def close(self) -> None:
        await asyncio.gather(*(n.close() for n in self._notifiers.values()))


class ClusterShard(Shard):
    """A Redis Cluster seen as one shard (see the module docstring)."""

    def __init__(self, url: str, *args: Any, **kwargs: Any) -> None:
        self.cluster: ClusterTarget = parse_cluster_url(url)
        self._nodes: dict[tuple[str, int], _Node] = {}
        self.redirects: collections.Counter[str] = collections.Counter()
        """Hot-path commands the cluster redirected, by kind (MOVED, ASK, TRYAGAIN, ...)."""
        super().__init__(url, *args, **kwargs)
        # redis-py's cluster nodes raise MaxConnectionsError beyond max_connections
        # (a standalone shard's blocking pool queues the call): queue them here, so a
        # burst of attaches or consumer starts waits its turn instead of failing.
        self._client_calls = asyncio.Semaphore(self._settings.max_connections)
        self.cluster_notifier = ClusterNotifier(self)
        self.notifier = self.cluster_notifier

    def _make_client(self) -> tuple[Any, Endpoint]:
        target, settings = self.cluster, self._settings
        kwargs: dict[str, Any] = {
            "username": target.username,
            "password": target.password,
            "client_name": target.client_name,
            "max_connections": settings.max_connections,
            "socket_timeout": settings.operation_timeout,
            "socket_connect_timeout": settings.operation_timeout,
            # Retries follow MOVED/ASK and a failover; every redis-py call of busmq is
            # idempotent (pushes, reads and acks go over busmq's own connections).
            "retry": Retry(NoBackoff(), 3),
        }
        if target.tls:
            kwargs |= ssl_kwargs(target.ssl_options)
        client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.seeds], **kwargs
        )
        # The shard-wide connections go unused: calls take their node's (see _mux_for).
        return client, self._endpoint(*target.seeds[0])

    def _endpoint(self, host: str, port: int) -> Endpoint:
        # redis-py reads the node's URL (login, TLS options) as it does a shard's.
        pool = ConnectionPool.from_url(self.cluster.node_url(host, port))
        return Endpoint.from_pool(pool, f"{self.label} node {host}:{port}")

    def _node(self, host: str, port: int) -> _Node:
        node = self._nodes.get((host, port))
        if node is None:
            endpoint = self._endpoint(host, port)
            node = self._nodes[(host, port)] = _Node(endpoint, self._settings.operation_timeout)
        return node

    def node_of(self, key: str | bytes | None) -> tuple[str, int]:
        """The address of the master serving ``key``'s slot (any master for ``None``)."""
        manager = self.client.nodes_manager
        try:
            if key is None:
                owner = manager.default_node or random.choice(self.client.get_primaries())
            else:
                owner = manager.get_node_from_slot(
                    key_slot(key.encode() if isinstance(key, str) else key)
                )
        except (rex.SlotNotCoveredError, IndexError) as exc:  # no slot map (yet)
            raise rex.ConnectionError(f"{self.label}: {exc or 'no master known'}") from None
        return owner.host, int(owner.port)

    def _master_of(self, route: str | None) -> _Node:
        return self._node(*self.node_of(route))

    # -- the hooks of Shard ------------------------------------------------------------

    def _mux_for(self, route: str | None, redirect: Redirect | None = None) -> MuxClient:
        if redirect is not None and redirect.ask is not None:
            return _AskingMux(self._node(*redirect.ask).mux)
        return self._master_of(route).mux

    def _confirmed_for(self, route: str | None) -> ConfirmedWrites:
        return self._master_of(route).confirmed

    async def _redirect(self, exc: rex.ResponseError) -> Redirect | None:
        redirect = await self._follow(exc)
        if redirect is not None:
            kind = type(exc).__name__.removesuffix("Error").upper()
            self.redirects[kind] += 1
            log.debug("%s: %s %s", self.label, kind, exc)
        return redirect

    async def _follow(self, exc: rex.ResponseError) -> Redirect | None:
        if isinstance(exc, rex.AskError):  # MovedError is an AskError too
            if isinstance(exc, rex.MovedError):
                await self.client.nodes_manager.move_slot(exc)
                return Redirect(pause=False)
            return Redirect(ask=(exc.host, int(exc.port)), pause=False)
        if isinstance(exc, rex.TryAgainError):
            return Redirect()  # the retry loop backs off a little before sending again
        if isinstance(exc, rex.ClusterDownError) or is_wrong_node(exc):
            # A failover under way, or a demoted master: read the topology again.
            self.report_failure(exc)
            return Redirect()
        return None

    async def check_topology(self) -> None:
        """Read the slot map; a node that is not in cluster mode is a
        :class:`TopologyError`. Unreachable nodes are left to the health probe."""
        try:
            await self.client.initialize()
            versions = await asyncio.gather(
                *(self._version(m.host, int(m.port)) for m in self.client.get_primaries())
            )
        except rex.RedisClusterException as exc:
            if _NOT_A_CLUSTER in str(exc):
                raise TopologyError(f"{self.label}: {exc}") from None
            self.last_error = exc
        except CONNECTION_ERRORS as exc:
            self.last_error = exc
        else:
            self.sharded_pubsub = bool(versions) and min(versions) >= (7, 0)

    async def _version(self, host: str, port: int) -> tuple[int, ...]:
        info = await self._node(host, port).mux.execute(b"INFO", b"server")
        found = re.search(rb"redis_version:(\d+)\.(\d+)", info)
        return (int(found.group(1)), int(found.group(2))) if found else (0, 0)

    async def _probe(self) -> None:
        """Read the topology (a failover changes it) and ping every master."""
        try:
            await self.client.nodes_manager.initialize()
        except rex.RedisClusterException as exc:
            raise rex.ConnectionError(str(exc)) from None
        masters = self.client.get_primaries()
        await asyncio.gather(
            *(self._node(m.host, int(m.port)).mux.execute(b"PING") for m in masters)
        )
        await self.cluster_notifier.follow_slots()

    async def _drop_idle_connections(self) -> None:
        # Marked, not closed here: redis-py closes a marked connection as it next takes
        # or frees it. Closing a free one from here races a call taking it meanwhile,
        # which then writes to a closed transport (TypeError on CPython 3.12+).
        for node in self.client.get_nodes():
            for connection in node._connections:
                connection.mark_for_reconnect()

    async def _close_client(self) -> None:
        await asyncio.gather(*(node.aclose() for node in self._nodes.values()))
        await self.client.aclose()


def sync_cluster_client(target: ClusterTarget, *, connect_timeout: float, timeout: float) -> Any:
    """A sync redis-py client of the cluster (for the Spark data source's workers)."""
    import redis.cluster

    kwargs: dict[str, Any] = {
        "username": target.username,
        "password": target.password,
        "client_name": target.client_name,
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": timeout,
    }
    if target.tls:
        kwargs |= ssl_kwargs(target.ssl_options)
    nodes = [
        redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
        for host, port in target.seeds
    ]
    return redis.cluster.RedisCluster(startup_nodes=nodes, **kwargs)
