"""Gateway configuration: listen address, secrets, TLS, limits, keepalive."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from busmq import BusSettings
from busmq.private import read_secret_file
from busmq.security import GENERATE_SECRET, is_loopback, weak_secret_reason

from .principals import Principal, everything


@dataclass(frozen=True)
class TlsSettings:
    """Server certificate and key (PEM files), and a CA to require client certificates."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file", "client_ca_file"):
            value = getattr(self, name)
            if value is not None:  # a str or os.PathLike is taken as a path
                object.__setattr__(self, name, Path(value))

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        ca = self.client_ca_file.read_bytes() if self.client_ca_file else None
        return self.cert_file.read_bytes(), self.key_file.read_bytes(), ca


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway needs.

    Args:
        listen: ``host:port`` to bind (port 0 picks a free one).
        secrets: shared secrets accepted as ``authorization: Bearer <secret>``; several
            may be active at once for rotation. The simple form: one principal,
            ``default``, allowed everything.
        principals: callers with their own credentials, grants and limits
            (:mod:`busmq_gateway.principals`, ``--config FILE``); with ``secrets``, the
            ``default`` principal is added to them.
        allow_no_auth: serve without any secret; refused unless ``listen`` is loopback.
        tls: certificate and key (and client CA for mTLS); plaintext when ``None``.
        allow_plaintext: serve without TLS on an address that is not loopback (bearer
            secrets then cross the network in cleartext: only behind a TLS-terminating
            proxy or mesh); refused otherwise. Secrets must be at least 16 bytes with 8
            distinct characters.
        bus: the bus the gateway serves (default: from the environment, i.e. the
            embedded Redis unless ``BUSMQ_REDIS_URLS`` is set).
        max_message_bytes: largest gRPC message accepted or sent.
        max_streams: server streams (Consume, ConnectChannel, Serve, PushStream ...) open at
            once in one gateway process, every principal together; a stream beyond it is
            refused ``RESOURCE_EXHAUSTED`` (reason ``GATEWAY_STREAM_LIMIT``, the limit in
            its ErrorInfo) with a throttled log line. 0: no limit. Principals have their
            own ``max_streams`` too.
        keepalive_seconds: HTTP/2 ping interval on idle connections (long-lived streams
            behind proxies); ``heartbeat_seconds``: idle interval between stream heartbeats.
        grace_seconds: how long SIGTERM waits for streams and calls to finish.
        default_prefetch / max_prefetch: read-ahead per stream, bounding gateway memory.
        http_listen: ``host:port`` of the HTTP listener (``/metrics``, ``/healthz``, the
            dashboard), or ``None`` for none. Open on loopback; elsewhere it needs a
            secret and TLS (or ``allow_plaintext``), like the gRPC port.
        http_allowed_hosts: host names the HTTP listener answers besides its own
            (``name`` or ``name:port``, e.g. the name a proxy forwards): see
            :mod:`busmq_gateway.web_guard`.
        history_seconds: interval between the samples of the dashboard's charts (an hour
            of them is kept in the gateway process, for at most 1,000 queues).
        metrics_max_queues: queues reported under their own label; the rest are summed.
        metrics_cache_seconds: how long one read of the bus's figures serves scrapes.
        reuse_port: bind the port with ``SO_REUSEPORT``, shared by the worker processes
            of one supervisor (``--workers``); off, a second gateway on the same port
            fails to start.
        fleet_secret: the secret the gateways of a fleet sign the ids they hand out with
            (:mod:`busmq_gateway.fleet`); ``None``: a key kept in Redis, shared by every
            gateway over the same Redis.
    """

    listen: str = "127.0.0.1:8443"
    secrets: tuple[str, ...] = ()
    principals: tuple[Principal, ...] = ()
    allow_no_auth: bool = False
    tls: TlsSettings | None = None
    allow_plaintext: bool = False
    bus: BusSettings = field(default_factory=BusSettings.from_env)
    max_message_bytes: int = 8 * 1024 * 1024
    max_streams: int = 20_000
    keepalive_seconds: float = 30.0
    heartbeat_seconds: float = 15.0
    grace_seconds: float = 10.0
    default_prefetch: int = 100
    max_prefetch: int = 1000
    http_listen: str | None = None
    http_allowed_hosts: tuple[str, ...] = ()
    history_seconds: float = 10.0
    metrics_max_queues: int = 100
    metrics_cache_seconds: float = 2.0
    reuse_port: bool = False
    fleet_secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if ":" not in self.listen:
            raise ValueError(f"listen must be host:port, got {self.listen!r}")
        if any(not s or s != s.strip() for s in self.secrets):
            raise ValueError("secrets must be non-empty and carry no surrounding whitespace")
        self._check_auth()
        for number, secret in enumerate(self.secrets, 1):
            if reason := weak_secret_reason(secret):
                raise ValueError(
                    f"secret #{number} is too weak ({reason}); generate one with: {GENERATE_SECRET}"
                )
        if self.tls is None and not self.allow_plaintext and not is_loopback(self.listen):
            raise ValueError(
                f"refusing to serve plaintext on {self.listen}: bearer secrets would cross "
                "the network in cleartext. Configure TLS (--tls-cert/--tls-key), listen on "
                "a loopback address, or pass --allow-plaintext if a TLS-terminating proxy "
                "or mesh encrypts the hop"
            )
        for name in ("keepalive_seconds", "heartbeat_seconds", "grace_seconds", "history_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.http_listen is not None:
            self._check_http_listen(self.http_listen)
        if self.fleet_secret is not None and (reason := weak_secret_reason(self.fleet_secret)):
            raise ValueError(f"the fleet secret is too weak ({reason}); generate one with: "
                             f"{GENERATE_SECRET}")  # fmt: skip
        if self.max_streams < 0:
            raise ValueError("max_streams must be 0 (no limit) or more")
        if not 1 <= self.default_prefetch <= self.max_prefetch:
            raise ValueError("need 1 <= default_prefetch <= max_prefetch")

    def _check_auth(self) -> None:
        if not self.authenticated and not self.allow_no_auth:
            raise ValueError(
                "no secret configured: set BUSMQ_GATEWAY_SECRETS (or --secret/--secret-file, "
                "or principals with --config), or pass --insecure-no-auth to serve without "
                "auth on loopback"
            )
        if not self.authenticated and not is_loopback(self.listen):
            raise ValueError("serving without auth is only allowed on a loopback address")
        if any(p.client_certificate for p in self.principals) and (
            self.tls is None or self.tls.client_ca_file is None
        ):
            raise ValueError(
                "principals identified by client certificate need mTLS: "
                "--tls-cert, --tls-key and --tls-client-ca"
            )
        if self.secrets and any(p.name == "default" for p in self.principals):
            raise ValueError(
                "a principal is named 'default', the name of the plain secrets' principal"
            )

    def _check_http_listen(self, listen: str) -> None:
        if ":" not in listen:
            raise ValueError(f"http_listen must be host:port, got {listen!r}")
        if is_loopback(listen):
            return
        if not any(p.metrics and p.secrets for p in self.all_principals):
            raise ValueError(
                f"the HTTP listener on {listen} would serve metrics and the dashboard to "
                "anyone: off loopback it needs a gateway secret (or a principal with "
                "metrics = true and a secret)"
            )
        if self.tls is None and not self.allow_plaintext:
            raise ValueError(
                f"refusing to serve HTTP in plaintext on {listen}: configure TLS "
                "(--tls-cert/--tls-key), listen on a loopback address, or pass "
                "--allow-plaintext"
            )

    @property
    def authenticated(self) -> bool:
        """Whether callers must prove who they are (a secret or a principal)."""
        return bool(self.secrets or self.principals)

    @property
    def all_principals(self) -> tuple[Principal, ...]:
        """The configured principals, and ``default`` for the plain secrets."""
        simple = (everything("default", self.secrets),) if self.secrets else ()
        return self.principals + simple

    def __repr__(self) -> str:
        return (
            f"GatewaySettings(listen={self.listen!r}, secrets=<{len(self.secrets)} hidden>, "
            f"principals={[p.name for p in self.principals]}, "
            f"tls={self.tls is not None}, bus={self.bus!r})"
        )

    @property
    def plaintext_off_loopback(self) -> bool:
        """Serving without TLS where the traffic may leave the machine (allowed only
        with ``allow_plaintext``)."""
        return self.tls is None and not is_loopback(self.listen)


def read_secrets(
    values: list[str], files: list[str], environ: dict[str, str] | None = None
) -> tuple[str, ...]:
    """Secrets from flags, files (one per line) and ``BUSMQ_GATEWAY_SECRETS`` (comma-separated)."""
    env = os.environ if environ is None else environ
    found = [v.strip() for v in values]
    for path in files:
        found += [line.strip() for line in read_secret_file(path).splitlines() if line.strip()]
    found += [s.strip() for s in env.get("BUSMQ_GATEWAY_SECRETS", "").split(",") if s.strip()]
    return tuple(dict.fromkeys(found))
