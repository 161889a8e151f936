"""Federation configuration: the remote gateways (targets) and the local outbox."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from ..security import is_loopback_host

_SCHEMES = ("http", "https")


def normalize_url(url: str) -> str:
    """``scheme://host:port`` of a gateway URL, the key targets are known by.

    ``https://`` means TLS, ``http://`` plaintext (loopback, tests, or a private network
    behind TLS-terminating infrastructure). The port is required: gateways have no
    well-known port. Raises ``ValueError`` for anything else.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"gateway URL {url!r}: use https://host:port (or http:// for plaintext)")
    if not parts.hostname:
        raise ValueError(f"gateway URL {url!r} has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"gateway URL {url!r} has an invalid port") from None
    if port is None:
        raise ValueError(f"gateway URL {url!r} has no port")
    if parts.username or parts.password:
        raise ValueError(f"gateway URL {url!r}: put the secret in FederationTarget.secret")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"gateway URL {url!r} must not have a path or query")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def grpc_address(url: str) -> str:
    """``host:port`` of a normalized gateway URL, as gRPC wants it."""
    return url.split("://", 1)[1]


@dataclass(frozen=True)
class FederationTarget:
    """One remote datacenter's gateway (or pool of gateway instances) and how to reach it.

    ``url`` is the target's identity: federated objects are addressed by it
    (``bus.federate(queue, url)``), and the outbox, events and status are keyed by it.
    ``fallback_urls`` are other instances of the same gateway service (same Redis
    behind them). The link uses one URL at a time, starting with ``url``; when a probe
    of that URL fails for any reason but refused credentials, the next probe goes to
    the next URL (round-robin, one probe per backoff step), and the first that answers
    takes over the channel pool (a ``failover`` event). The link stays on that URL
    until it fails in turn (sticky: no return to ``url`` while the current URL works,
    so no flapping and no needless stream moves).

    Args:
        url: ``https://host:port`` (TLS) or ``http://host:port`` (plaintext).
        secret: the gateway's shared secret, sent as ``authorization: Bearer <secret>``
            (``None`` for a gateway running without auth). Never shown in ``repr``.
        root_ca_file: PEM bundle to verify the gateway's certificate (default: the
            system roots).
        client_cert_file, client_key_file: PEM client certificate and key for mTLS.
        pool_size: warm HTTP/2 connections kept open to the gateway; calls and streams
            are spread over them round-robin.
        keepalive_seconds: HTTP/2 ping interval, so dead connections of long-lived
            streams are noticed (and idle proxies do not drop them);
            ``keepalive_timeout_seconds``: how long a ping may go unanswered.
        server_name: expected name in the gateway's certificate, when it differs from
            the URL's host.
        fallback_urls: further gateway URLs of the same target, tried in this order
            after ``url`` (kept normalized, as a tuple). They must use the same scheme
            as ``url`` (the secret, TLS files and ``server_name`` apply to all of
            them); duplicates are refused.
        allow_plaintext: accept ``http://`` URLs whose host is not loopback. The secret
            then crosses the network in cleartext, so this is refused unless asked for
            (e.g. a TLS-terminating proxy or mesh in between), and logged as a warning.
            ``https://`` always verifies the gateway's certificate (``root_ca_file``
            for a private CA); there is no option to skip that.
    """

    url: str
    secret: str | None = field(default=None, repr=False)
    root_ca_file: Path | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    pool_size: int = 2
    keepalive_seconds: float = 20.0
    keepalive_timeout_seconds: float = 10.0
    server_name: str | None = None
    fallback_urls: Sequence[str] = ()
    allow_plaintext: bool = False

    def __post_init__(self) -> None:
        for name in ("root_ca_file", "client_cert_file", "client_key_file"):
            value = getattr(self, name)
            if value is not None:  # a str or os.PathLike is taken as a path
                object.__setattr__(self, name, Path(value))
        object.__setattr__(self, "url", normalize_url(self.url))
        object.__setattr__(self, "fallback_urls", self._normalize_fallbacks())
        if self.plaintext_off_loopback and not self.allow_plaintext:
            raise ValueError(
                f"{self.url}: refusing plaintext (http://) to a host that is not loopback: "
                "the secret would cross the network in cleartext. Use https:// (with "
                "root_ca_file for a private CA), or allow_plaintext=True if a "
                "TLS-terminating proxy or mesh encrypts the hop"
            )
        if self.secret is not None and (not self.secret or self.secret != self.secret.strip()):
            raise ValueError("secret must be non-empty and carry no surrounding whitespace")
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("mTLS needs both client_cert_file and client_key_file")
        uses_tls_files = self.root_ca_file or self.client_cert_file or self.server_name
        if not self.tls and uses_tls_files:
            raise ValueError(f"{self.url}: TLS files and server_name need an https:// URL")
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {self.pool_size}")
        if self.keepalive_seconds <= 0 or self.keepalive_timeout_seconds <= 0:
            raise ValueError("keepalive_seconds and keepalive_timeout_seconds must be positive")

    def _normalize_fallbacks(self) -> tuple[str, ...]:
        if isinstance(self.fallback_urls, str):
            raise TypeError("fallback_urls is a sequence of URLs, not one string")
        scheme = self.url.split("://", 1)[0]
        seen = {self.url}
        result = []
        for raw in self.fallback_urls:
            url = normalize_url(raw)
            if not url.startswith(f"{scheme}://"):
                raise ValueError(
                    f"fallback URL {url} must use {scheme}:// like {self.url}: all URLs of a "
                    "target share TLS settings and credentials"
                )
            if url in seen:
                raise ValueError(f"gateway URL {url} appears twice in target {self.url}")
            seen.add(url)
            result.append(url)
        return tuple(result)

    @property
    def urls(self) -> tuple[str, ...]:
        """Every gateway URL of the target: ``url`` first, then ``fallback_urls``."""
        return (self.url, *self.fallback_urls)

    @property
    def tls(self) -> bool:
        return self.url.startswith("https://")

    @property
    def plaintext_off_loopback(self) -> bool:
        """Plaintext to a URL whose host is not loopback (needs ``allow_plaintext``)."""
        hosts = (urlsplit(url).hostname or "" for url in self.urls)
        return not self.tls and not all(is_loopback_host(h) for h in hosts)

    @property
    def address(self) -> str:
        """``host:port`` of ``url`` as gRPC wants it (see :func:`grpc_address`)."""
        return grpc_address(self.url)

    def read_credentials(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(root CA, client key, client certificate) PEM bytes, each ``None`` if unset."""

        def read(path: Path | None) -> bytes | None:
            return Path(path).read_bytes() if path is not None else None

        return read(self.root_ca_file), read(self.client_key_file), read(self.client_cert_file)


def _targets(
    value: Mapping[str, FederationTarget] | Iterable[FederationTarget],
) -> Mapping[str, FederationTarget]:
    items = value.values() if isinstance(value, Mapping) else value
    result: dict[str, FederationTarget] = {}
    for target in items:
        if not isinstance(target, FederationTarget):
            raise TypeError(f"targets must be FederationTarget objects, got {target!r}")
        if target.url in result:
            raise ValueError(f"target {target.url} is configured twice")
        result[target.url] = target
    return MappingProxyType(result)


@dataclass(frozen=True)
class FederationSettings:
    """How a bus federates objects that live in other datacenters.

    Args:
        targets: the gateways this bus may federate to (a sequence, or a mapping whose
            values are used); they are known by their normalized URL. Links to them
            are opened as soon as the settings are given to the bus.
        outbox_path: the SQLite file of the durable outbox (default
            ``<BusSettings.data_dir>/../outbox.sqlite3``). One process at a time may
            use a given file (it is locked).
        outbox_max_messages: messages the outbox may hold; a push beyond it raises
            :class:`~busmq.federation.OutboxFullError`.
        outbox_max_age: seconds; while the oldest waiting push is older than this, new
            pushes that would wait in the outbox are refused with ``OutboxFullError``
            (``None``: no age limit). What is already in the outbox is never dropped.
        reconnect_backoff_initial / reconnect_backoff_max: seconds; a broken link is
            probed again after an exponential, jittered backoff between these bounds
            (also used by resuming streams and the gRPC channels' own reconnects).
        connect_timeout: seconds a link probe (and a stream's (re)open) may take.
        operation_timeout: seconds any remote call may take (default: the bus's
            ``operation_timeout``).
        forward_batch_rows: outbox rows read per forwarding round.
    """

    targets: Mapping[str, FederationTarget] | Iterable[FederationTarget] = ()
    outbox_path: Path | None = None
    outbox_max_messages: int = 1_000_000
    outbox_max_age: float | None = 86_400.0
    reconnect_backoff_initial: float = 0.2
    reconnect_backoff_max: float = 10.0
    connect_timeout: float = 5.0
    operation_timeout: float | None = None
    forward_batch_rows: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", _targets(self.targets))
        if self.outbox_path is not None:
            object.__setattr__(self, "outbox_path", Path(self.outbox_path))
        if self.outbox_max_messages < 1:
            raise ValueError("outbox_max_messages must be at least 1")
        if self.outbox_max_age is not None and self.outbox_max_age <= 0:
            raise ValueError("outbox_max_age must be positive (or None)")
        if not 0 < self.reconnect_backoff_initial <= self.reconnect_backoff_max:
            raise ValueError("need 0 < reconnect_backoff_initial <= reconnect_backoff_max")
        if self.connect_timeout <= 0:
            raise ValueError("connect_timeout must be positive")
        if self.operation_timeout is not None and self.operation_timeout <= 0:
            raise ValueError("operation_timeout must be positive")
        if self.forward_batch_rows < 1:
            raise ValueError("forward_batch_rows must be at least 1")

    @property
    def target_map(self) -> Mapping[str, FederationTarget]:
        """The targets by normalized URL."""
        targets = self.targets
        assert isinstance(targets, Mapping)  # normalized in __post_init__
        return targets

    def target(self, url: str) -> FederationTarget | None:
        """The configured target for ``url`` (any spelling that normalizes the same)."""
        return self.target_map.get(normalize_url(url))
