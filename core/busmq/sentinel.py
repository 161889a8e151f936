"""Sentinel-managed shards: redis-py's Sentinel client finds the master; busmq's
connections ask it again whenever they connect.

The redis-py connection pool of a Sentinel shard is redis-py's
``SentinelConnectionPool`` made blocking (calls queue for a connection, as on every
shard), and the shard's auto-pipelined connection and notifier take the master's
address from the same pool (see :class:`~busmq.mux.Endpoint`). After a failover the
old master's connections fail (or answer ``READONLY``); the next connection goes to the
address the Sentinels give then.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.exceptions as rex
import redis.sentinel
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff

from .errors import TopologyError
from .topology import SentinelTarget, mask_url, ssl_kwargs


class SentinelBlockingPool(SentinelConnectionPool, BlockingConnectionPool):
    """redis-py's Sentinel pool with the blocking pool's bounded size."""


def sentinel_client(target: SentinelTarget, timeout: float) -> Sentinel:
    """redis-py's Sentinel client for ``target``'s Sentinels."""
    kwargs = _sentinel_kwargs(target, timeout)
    kwargs |= {"socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0)}
    return Sentinel(list(target.sentinels), sentinel_kwargs=kwargs)  # type: ignore[no-untyped-call]


def master_pool(
    target: SentinelTarget, sentinel: Sentinel, *, max_connections: int, connect_timeout: float
) -> SentinelBlockingPool:
    """A blocking pool of connections to ``target``'s current master."""
    kwargs: dict[str, Any] = {
        "db": target.db,
        "username": target.username,
        "password": target.password,
        "client_name": target.client_name,
        "max_connections": max_connections,
        "timeout": None,
        "retry": Retry(NoBackoff(), 0),
        "socket_timeout": None,  # every call is bounded by the shard's timeout
        "socket_connect_timeout": connect_timeout,
    }
    if target.tls:
        kwargs |= ssl_kwargs(target.ssl_options)
    return SentinelBlockingPool(target.service, sentinel, **kwargs)  # type: ignore[no-untyped-call]


def sync_master_client(
    target: SentinelTarget, *, connect_timeout: float, timeout: float
) -> redis.Redis:
    """A sync redis-py client of ``target``'s master (for the Spark data source, whose
    Python workers run plain sync code)."""
    sentinel_kwargs = _sentinel_kwargs(target, connect_timeout)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=sentinel_kwargs
    )
    kwargs: dict[str, Any] = {
        "db": target.db,
        "username": target.username,
        "password": target.password,
        "client_name": target.client_name,
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": timeout,
    }
    if target.tls:
        kwargs |= ssl_kwargs(target.ssl_options)
    client: redis.Redis = sentinel.master_for(target.service, **kwargs)  # type: ignore[no-untyped-call]
    return client


def _sentinel_kwargs(target: SentinelTarget, timeout: float) -> dict[str, Any]:
    """How to reach and log in to the Sentinels themselves."""
    kwargs: dict[str, Any] = {"socket_timeout": timeout}
    if target.sentinel_username:
        kwargs["username"] = target.sentinel_username
    if target.sentinel_password:
        kwargs["password"] = target.sentinel_password
    if target.sentinel_tls:
        kwargs |= ssl_kwargs(target.ssl_options)
    return kwargs


async def check_service(sentinel: Sentinel, target: SentinelTarget, timeout: float) -> None:
    """Fail fast on a service name that no reachable Sentinel knows
    (:class:`TopologyError`). Unreachable Sentinels are left to the shard's retries."""
    answered = False
    for node in sentinel.sentinels:
        try:
            async with asyncio.timeout(timeout):
                masters = await node.sentinel_masters()
        except (rex.ConnectionError, rex.TimeoutError, TimeoutError, OSError):
            continue
        except rex.ResponseError as exc:
            raise TopologyError(
                f"{mask_url(target.url)}: {node.connection_pool.connection_kwargs['host']}:"
                f"{node.connection_pool.connection_kwargs['port']} is not a Sentinel ({exc})"
            ) from None
        answered = True
        if target.service in masters:
            return
    if answered:
        raise TopologyError(
            f"{mask_url(target.url)}: no Sentinel monitors a master named {target.service!r}"
        )
