"""Bus configuration: frozen, validated settings built from arguments or the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_SCHEMES = ("redis", "rediss", "unix")


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe for logs and reprs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def validate_redis_url(url: str) -> str:
    """Check that ``url`` is a Redis URL busmq can use; raise ``ValueError`` otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ValueError(
            f"unsupported Redis URL scheme in {mask_url(url)!r}: use one of {', '.join(_SCHEMES)}"
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"unix Redis URL {mask_url(url)!r} has no socket path")
    elif not parts.hostname:
        raise ValueError(f"Redis URL {mask_url(url)!r} has no host")
    return url


def default_data_dir() -> Path:
    """Where the embedded Redis keeps its data when ``BUSMQ_DATA_DIR`` is not set."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "busmq" / "redis"


@dataclass(frozen=True)
class BusSettings:
    """Everything a :class:`~busmq.Bus` needs to know.

    Args:
        redis_urls: one URL per shard (``redis://``, ``rediss://``, ``unix://``). Empty
            means: start an embedded ``redis-server`` persisting to ``data_dir``.
        data_dir: data directory of the embedded Redis.
        operation_timeout: upper bound in seconds for any single operation.
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
    """

    redis_urls: tuple[str, ...] = ()
    data_dir: Path = field(default_factory=default_data_dir)
    operation_timeout: float = 5.0
    lease_seconds: float = 15.0
    default_ttl: float = 30.0
    max_message_bytes: int = 1024 * 1024
    block_seconds: float = 1.0
    max_connections: int = 128
    health_interval: float = 1.0
    reconnect_backoff_max: float = 5.0
    dedupe_seconds: float = 600.0

    def __post_init__(self) -> None:
        for url in self.redis_urls:
            validate_redis_url(url)
        if len(set(self.redis_urls)) != len(self.redis_urls):
            raise ValueError("redis_urls lists the same shard twice")
        positive = {
            "operation_timeout": self.operation_timeout,
            "lease_seconds": self.lease_seconds,
            "default_ttl": self.default_ttl,
            "max_message_bytes": self.max_message_bytes,
            "block_seconds": self.block_seconds,
            "max_connections": self.max_connections,
            "health_interval": self.health_interval,
            "reconnect_backoff_max": self.reconnect_backoff_max,
            "dedupe_seconds": self.dedupe_seconds,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BusSettings:
        """Build settings from the environment: ``BUSMQ_REDIS_URLS`` (comma-separated),
        ``BUSMQ_DATA_DIR``, and ``BUSMQ_<FIELD>`` for every numeric field (for example
        ``BUSMQ_LEASE_SECONDS=5``)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        urls = tuple(u.strip() for u in env.get("BUSMQ_REDIS_URLS", "").split(",") if u.strip())
        if urls:
            values["redis_urls"] = urls
        if env.get("BUSMQ_DATA_DIR"):
            values["data_dir"] = Path(env["BUSMQ_DATA_DIR"])
        for f in fields(cls):
            raw = env.get(f"BUSMQ_{f.name.upper()}")
            if raw is None or f.name in ("redis_urls", "data_dir"):
                continue
            kind = int if f.type in (int, "int") else float
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ValueError(f"BUSMQ_{f.name.upper()} must be a number, got {raw!r}") from None
        return cls(**values)

    def __repr__(self) -> str:
        urls = ", ".join(mask_url(u) for u in self.redis_urls)
        return f"BusSettings(redis_urls=[{urls}], data_dir={str(self.data_dir)!r})"
