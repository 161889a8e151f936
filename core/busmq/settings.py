"""Bus configuration: frozen, validated settings built from arguments or the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .durability import Durability
from .topology import mask_url, split_urls, validate_redis_url, validate_redis_urls

__all__ = ["BusSettings", "default_data_dir", "mask_url", "validate_redis_url"]


def default_data_dir() -> Path:
    """Where the embedded Redis keeps its data when ``BUSMQ_DATA_DIR`` is not set."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "busmq" / "redis"


@dataclass(frozen=True)
class BusSettings:
    """Everything a :class:`~busmq.Bus` needs to know.

    Args:
        redis_urls: one URL per shard (``redis://``, ``rediss://``, ``unix://``, or
            ``redis+sentinel://`` for a Sentinel-managed master, or one
            ``redis+cluster://`` URL, see :mod:`busmq.topology`). Empty means: start an
            embedded ``redis-server`` persisting to ``data_dir``.
        data_dir: data directory of the embedded Redis (a ``Path``, ``str`` or other
            ``os.PathLike``; kept as a ``Path``).
        operation_timeout: upper bound in seconds for any single operation while Redis
            is up (a stalled server fails calls within it).
        failover_timeout: how long a call waits for a shard that went down (a Sentinel
            or cluster failover, a restart) to come back: acks, reads, counts and other
            calls that are safe to repeat, and pushes not yet sent, wait up to this long
            and then go on; only a longer outage raises
            :class:`~busmq.errors.BusUnavailableError`. The default is a little above
            a Sentinel failover with ``down-after-milliseconds`` 5000 to 10000.
        lease_seconds: how long an attachment lasts without renewal; clients renew it
            every third of that. A crashed client's attachment lapses after this.
        default_ttl: seconds a queue survives after its last client detached.
        max_message_bytes: largest encoded message (payload plus headers) accepted.
        block_seconds: longest an idle consumer waits for a wake-up before reading
            again (a safety net for lost notifications; also paces reclaim checks).
        max_connections: Redis connections per shard and process (calls queue beyond).
        health_interval: seconds between health probes of each shard.
        reconnect_backoff_max: cap in seconds of the exponential reconnect backoff.
        dedupe_seconds: how long a push ``request_id`` is remembered for idempotent retries.
        durability: when a push counts as acknowledged (``"async"``, ``"replicas=N"``,
            ``"fsync"``; see :mod:`busmq.durability`); pushes may ask for another.
        durability_timeout: how long a push waits for replicas or the fsync to confirm
            it before raising :class:`~busmq.errors.DurabilityError` (at most half the
            operation timeout).
        tracing: OpenTelemetry trace propagation through message headers, with
            producer and consumer spans (:mod:`busmq.tracing`; needs ``busmq[otel]``).
    """

    redis_urls: tuple[str, ...] = ()
    data_dir: Path = field(default_factory=default_data_dir)
    operation_timeout: float = 5.0
    failover_timeout: float = 30.0
    lease_seconds: float = 15.0
    default_ttl: float = 30.0
    max_message_bytes: int = 1024 * 1024
    block_seconds: float = 1.0
    max_connections: int = 128
    health_interval: float = 1.0
    reconnect_backoff_max: float = 5.0
    dedupe_seconds: float = 600.0
    durability: Durability = Durability.ASYNC
    durability_timeout: float = 1.0
    tracing: bool = False

    def __post_init__(self) -> None:
        # A str (or any os.PathLike) is taken as a path, as most callers write it.
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "durability", Durability.parse(self.durability))
        validate_redis_urls(self.redis_urls)
        positive = {
            "operation_timeout": self.operation_timeout,
            "failover_timeout": self.failover_timeout,
            "lease_seconds": self.lease_seconds,
            "default_ttl": self.default_ttl,
            "max_message_bytes": self.max_message_bytes,
            "block_seconds": self.block_seconds,
            "max_connections": self.max_connections,
            "health_interval": self.health_interval,
            "reconnect_backoff_max": self.reconnect_backoff_max,
            "dedupe_seconds": self.dedupe_seconds,
            "durability_timeout": self.durability_timeout,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BusSettings:
        """Build settings from the environment: ``BUSMQ_REDIS_URLS`` (comma-separated),
        ``BUSMQ_DATA_DIR``, ``BUSMQ_DURABILITY``, and ``BUSMQ_<FIELD>`` for every numeric
        field (for example ``BUSMQ_LEASE_SECONDS=5``), ``BUSMQ_TRACING`` (true/false)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        urls = split_urls(env.get("BUSMQ_REDIS_URLS", ""))
        if urls:
            values["redis_urls"] = urls
        if env.get("BUSMQ_DATA_DIR"):
            values["data_dir"] = Path(env["BUSMQ_DATA_DIR"])
        if env.get("BUSMQ_DURABILITY"):
            values["durability"] = Durability.parse(env["BUSMQ_DURABILITY"])
        tracing = env.get("BUSMQ_TRACING", "").strip().lower()
        if tracing:
            if tracing not in ("1", "true", "yes", "0", "false", "no"):
                raise ValueError(f"BUSMQ_TRACING must be true or false, got {tracing!r}")
            values["tracing"] = tracing in ("1", "true", "yes")
        for f in fields(cls):
            raw = env.get(f"BUSMQ_{f.name.upper()}")
            if raw is None or f.name in ("redis_urls", "data_dir", "durability", "tracing"):
                continue
            kind = int if f.type in (int, "int") else float
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ValueError(f"BUSMQ_{f.name.upper()} must be a number, got {raw!r}") from None
        return cls(**values)

    @property
    def durability_wait(self) -> float:
        """The confirmation wait in force: ``durability_timeout``, capped at half the
        operation timeout so a slow confirmation is reported, not timed out."""
        return min(self.durability_timeout, self.operation_timeout / 2)

    def __repr__(self) -> str:
        urls = ", ".join(mask_url(u) for u in self.redis_urls)
        return (
            f"BusSettings(redis_urls=[{urls}], data_dir={str(self.data_dir)!r}, "
            f"durability={str(self.durability)!r})"
        )
