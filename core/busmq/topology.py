"""The Redis deployments a bus can run on, read from their URLs.

- ``redis://``, ``rediss://``, ``unix://``: one standalone server per URL (a shard).
- ``redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[?db=N]``: one shard
  that is the master Sentinel names ``SERVICE``, followed across failovers
  (``rediss+sentinel://`` for TLS). Query options: ``db``, ``sentinel_username``,
  ``sentinel_password`` (when the Sentinels require auth), ``sentinel_ssl`` (``yes`` or
  ``no``; default: as the data nodes), ``client_name`` and the ``ssl_*`` options of
  ``rediss://`` URLs.

- ``redis+cluster://[user:password@]host:port[,host:port...]``: one Redis Cluster, named
  by some of its nodes (``rediss+cluster://`` for TLS; query options ``client_name``
  and ``ssl_*``). Its slots place the queues; it must be the bus's only URL.

This module only parses and validates; :mod:`busmq.shard` and :mod:`busmq.cluster`
connect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

STANDALONE_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = STANDALONE_SCHEMES + SENTINEL_SCHEMES + CLUSTER_SCHEMES

_STARTS_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SENTINEL_OPTIONS = ("db", "sentinel_username", "sentinel_password", "sentinel_ssl", "client_name")
_SSL_OPTIONS = (
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
)


def mask_url(url: str) -> str:
    """Return ``url`` with any password (in the user part or the query) replaced by
    ``***``: safe for logs and reprs."""
    scheme, netloc, path, query, fragment = urlsplit(url)
    if "@" in netloc:
        login, hosts = netloc.rsplit("@", 1)
        if ":" in login:
            login = login.split(":", 1)[0] + ":***"
        netloc = f"{login}@{hosts}"
    if "password" in query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{k}={'***' if 'password' in k else v}" for k, v in pairs)
    return urlunsplit((scheme, netloc, path, query, fragment))


@dataclass(frozen=True)
class SentinelTarget:
    """A Sentinel-managed master, as a ``redis+sentinel://`` URL names it."""

    url: str
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False
    sentinel_tls: bool = False
    client_name: str | None = None
    ssl_options: tuple[tuple[str, str], ...] = ()

    @property
    def identity(self) -> str:
        """Placement identity: the Sentinels (sorted) and the service, not the master's
        address, which changes on failover."""
        hosts = ",".join(f"{h}:{p}" for h, p in sorted(self.sentinels))
        return f"sentinel://{hosts}/{self.service}/{self.db}"


def split_urls(text: str) -> tuple[str, ...]:
    """Split a comma-separated list of Redis URLs, as in ``BUSMQ_REDIS_URLS``. A piece
    with no ``scheme://`` continues the URL before it: the host list of a Sentinel URL
    (``redis+sentinel://h1:26379,h2:26379/svc,redis://other:6379`` is two URLs)."""
    urls: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if urls and not _STARTS_URL.match(piece):
            urls[-1] += "," + piece
        else:
            urls.append(piece)
    return tuple(urls)


@dataclass(frozen=True)
class ClusterTarget:
    """A Redis Cluster, as a ``redis+cluster://`` URL names it."""

    url: str
    seeds: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    client_name: str | None = None
    ssl_options: tuple[tuple[str, str], ...] = ()

    def node_url(self, host: str, port: int) -> str:
        """A ``redis://`` (or ``rediss://``) URL of one node, with this login."""
        login = ""
        if self.username or self.password:
            login = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        query = dict(self.ssl_options)
        if self.client_name:
            query["client_name"] = self.client_name
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{login}{host}:{port}" + (f"?{urlencode(query)}" if query else "")


def is_sentinel_url(url: str) -> bool:
    return urlsplit(url).scheme in SENTINEL_SCHEMES


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterTarget:
    """Read a ``redis+cluster://`` / ``rediss+cluster://`` URL; ``ValueError`` names what
    is wrong with it."""
    shown = mask_url(url)
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"{shown!r} is not a redis+cluster:// URL")
    username, password, seeds = _login_and_hosts(parts.netloc, f"cluster URL {shown!r}", "node")
    if parts.path.strip("/"):
        raise ValueError(f"cluster URL {shown!r}: a cluster has no databases, drop the path")
    tls = parts.scheme == "rediss+cluster"
    options, ssl_options = _options(parts.query, ("client_name",), tls, f"cluster URL {shown!r}")
    return ClusterTarget(
        url=url,
        seeds=seeds,
        username=username,
        password=password,
        tls=tls,
        client_name=options.get("client_name") or None,
        ssl_options=ssl_options,
    )


def validate_redis_urls(urls: tuple[str, ...]) -> None:
    """Check a bus's URL list: each URL, no shard twice, and a cluster URL alone."""
    for url in urls:
        validate_redis_url(url)
    if len(set(urls)) != len(urls):
        raise ValueError("redis_urls lists the same shard twice")
    if len(urls) > 1 and any(is_cluster_url(u) for u in urls):
        raise ValueError(
            "a redis+cluster:// URL must be the bus's only URL: the cluster's slots place "
            "the queues (add nodes to the cluster, not URLs to the bus)"
        )


def validate_redis_url(url: str) -> str:
    """Check that ``url`` names a Redis deployment busmq can use; raise ``ValueError``
    with the reason otherwise."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"a Redis URL must be a non-empty string, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
    elif parts.scheme in CLUSTER_SCHEMES:
        parse_cluster_url(url)
    elif parts.scheme not in STANDALONE_SCHEMES:
        raise ValueError(
            f"unsupported Redis URL scheme in {mask_url(url)!r}: use one of {', '.join(SCHEMES)}"
        )
    elif parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"unix Redis URL {mask_url(url)!r} has no socket path")
    elif not parts.hostname:
        raise ValueError(f"Redis URL {mask_url(url)!r} has no host")
    return url


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read a ``redis+sentinel://`` / ``rediss+sentinel://`` URL; ``ValueError`` names
    what is wrong with it."""
    shown = mask_url(url)
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise ValueError(f"{shown!r} is not a redis+sentinel:// URL")
    username, password, sentinels = _login_and_hosts(
        parts.netloc, f"Sentinel URL {shown!r}", "Sentinel"
    )
    service = unquote(parts.path.strip("/"))
    if not service or "/" in service:
        raise ValueError(
            f"Sentinel URL {shown!r} needs the master's service name as its path "
            "(redis+sentinel://host:port[,host:port]/SERVICE)"
        )
    tls = parts.scheme == "rediss+sentinel"
    options, ssl_options = _options(parts.query, _SENTINEL_OPTIONS, tls, f"Sentinel URL {shown!r}")
    return SentinelTarget(
        url=url,
        sentinels=sentinels,
        service=service,
        db=_db(options.get("db"), shown),
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        tls=tls,
        sentinel_tls=_flag(options.get("sentinel_ssl"), tls, "sentinel_ssl", shown),
        client_name=options.get("client_name") or None,
        ssl_options=ssl_options,
    )


def _options(
    query: str, allowed: tuple[str, ...], tls: bool, where: str
) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """A URL's query options (only ``allowed`` and ``ssl_*`` ones; ``ssl_*`` with TLS
    only), and the ``ssl_*`` ones apart."""
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - set(allowed) - set(_SSL_OPTIONS))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)}")
    ssl_options = tuple((k, v) for k, v in options.items() if k in _SSL_OPTIONS)
    if ssl_options and not tls:
        raise ValueError(f"{where}: ssl_* options need rediss+...:// (TLS)")
    return options, ssl_options


def _login_and_hosts(
    netloc: str, where: str, what: str
) -> tuple[str | None, str | None, tuple[tuple[str, int], ...]]:
    """``[user:password@]host:port[,host:port...]``: the login and the hosts."""
    login, _, hosts = netloc.rpartition("@")
    username, password = _login(login)
    found = tuple(_host_port(h, where) for h in hosts.split(",") if h.strip())
    if not found:
        raise ValueError(f"{where} names no {what} (host:port,...)")
    if len(set(found)) != len(found):
        raise ValueError(f"{where} lists a {what} twice")
    return username, password, found


def ssl_kwargs(options: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """redis-py's TLS keyword arguments from a URL's ``ssl_*`` options."""
    kwargs: dict[str, Any] = {"ssl": True, **dict(options)}
    if "ssl_check_hostname" in kwargs:
        kwargs["ssl_check_hostname"] = kwargs["ssl_check_hostname"].lower() in ("yes", "true", "1")
    return kwargs


def _login(login: str) -> tuple[str | None, str | None]:
    if not login:
        return None, None
    user, sep, password = login.partition(":")
    return (unquote(user) or None), (unquote(password) if sep else None)


def _host_port(text: str, where: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{where}: {text.strip()!r} is not host:port")
    return host.strip("[]"), int(port)


def _db(raw: str | None, shown: str) -> int:
    if raw is None or raw == "":
        return 0
    if not raw.isdigit():
        raise ValueError(f"Redis URL {shown!r}: db must be a non-negative integer, got {raw!r}")
    return int(raw)


def _flag(raw: str | None, default: bool, name: str, shown: str) -> bool:
    if raw is None or raw == "":
        return default
    if raw.lower() in ("yes", "true", "1"):
        return True
    if raw.lower() in ("no", "false", "0"):
        return False
    raise ValueError(f"Redis URL {shown!r}: {name} must be yes or no, got {raw!r}")
