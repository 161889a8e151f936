"""``busmq-gateway``: serve the bus over gRPC.

Secrets come from ``--secret``, ``--secret-file`` (one per line) and
``BUSMQ_GATEWAY_SECRETS`` (comma-separated); all of them are accepted at once, so a
secret can be rotated without downtime, and each may do everything. ``--config FILE``
names principals with their own credentials, grants and limits
(:mod:`busmq_gateway.principals`). The bus is the embedded Redis unless
``--redis-url`` or ``BUSMQ_REDIS_URLS`` names one or more shards.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from busmq import BusSettings
from busmq.private import read_secret_file

from . import logs, principals
from .allocator import cap_malloc_arenas
from .config import GatewaySettings, TlsSettings, read_secrets
from .server import serve

# A gateway allocates container objects per message (deliveries and their fields) that
# die young. At CPython's default thresholds (700, 10, 10) the collector took about a
# sixth of a flood's CPU (py-spy), most of it in full collections over the heap of
# grpc, protobuf and the modules; at these, a PushStream flood through one worker went
# from 0.52x to 0.63x of the direct core (bench/gateway_bench.py, docs/design.md). The
# third is 10, not 100: every closed stream leaves cycles (grpc's call objects, a
# consumer and its deliveries) that only a full collection frees, and at 100 the heap
# of a gateway with clients reconnecting grew 15 MiB between full collections.
GC_THRESHOLDS = (10_000, 20, 10)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="busmq-gateway", description=__doc__.splitlines()[0])
    env = os.environ.get
    parser.add_argument("--listen", default=env("BUSMQ_GATEWAY_LISTEN", "127.0.0.1:8443"))
    parser.add_argument("--secret", action="append", default=[], help="may repeat")
    parser.add_argument("--secret-file", action="append", default=[], help="may repeat")
    parser.add_argument(
        "--config",
        default=env("BUSMQ_GATEWAY_CONFIG"),
        help="TOML file of principals: credentials, grants and limits",
    )
    parser.add_argument(
        "--insecure-no-auth", action="store_true", help="serve without auth (loopback only)"
    )
    parser.add_argument(
        "--allow-plaintext",
        action="store_true",
        default=env("BUSMQ_GATEWAY_ALLOW_PLAINTEXT", "").lower() in ("1", "true", "yes"),
        help="serve without TLS on a non-loopback address (behind a TLS-terminating proxy)",
    )
    parser.add_argument("--tls-cert", default=env("BUSMQ_GATEWAY_TLS_CERT"))
    parser.add_argument("--tls-key", default=env("BUSMQ_GATEWAY_TLS_KEY"))
    parser.add_argument("--tls-client-ca", default=env("BUSMQ_GATEWAY_TLS_CLIENT_CA"))
    parser.add_argument(
        "--http-listen",
        default=env("BUSMQ_GATEWAY_HTTP_LISTEN", "127.0.0.1:8444"),
        help="/metrics, /healthz and the dashboard ('off' for none)",
    )
    parser.add_argument(
        "--http-allowed-hosts",
        default=env("BUSMQ_GATEWAY_HTTP_ALLOWED_HOSTS", ""),
        help="host names (name or name:port, comma-separated) the HTTP listener answers"
        " besides its own, e.g. the name a proxy forwards",
    )
    parser.add_argument(
        "--history-interval",
        type=float,
        default=float(env("BUSMQ_GATEWAY_HISTORY_INTERVAL", "10")),
        help="seconds between the samples of the dashboard's charts (an hour is kept)",
    )
    parser.add_argument(
        "--metrics-max-queues",
        type=int,
        default=100,
        help="queues with their own metrics label (the rest are summed as _other)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(env("BUSMQ_GATEWAY_WORKERS", "1")),
        help="gateway processes sharing the port (SO_REUSEPORT) under one supervisor",
    )
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--fleet-secret-file",
        default=env("BUSMQ_GATEWAY_FLEET_SECRET_FILE"),
        help="the secret every gateway of a fleet signs ids with (default: a key kept in Redis;"
        " also BUSMQ_GATEWAY_FLEET_SECRET)",
    )
    parser.add_argument("--redis-url", action="append", default=[], help="a shard; may repeat")
    parser.add_argument("--data-dir", help="embedded Redis data directory")
    parser.add_argument("--max-message-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument(
        "--max-streams",
        type=int,
        default=int(env("BUSMQ_GATEWAY_MAX_STREAMS", "20000")),
        help="server streams open at once in a process; more are refused RESOURCE_EXHAUSTED"
        " (0: no limit)",
    )
    parser.add_argument("--keepalive-seconds", type=float, default=30.0)
    parser.add_argument(
        "--drain-seconds",
        "--grace-seconds",
        dest="drain_seconds",
        type=float,
        default=float(env("BUSMQ_GATEWAY_DRAIN_SECONDS", "10")),
        help="on SIGTERM: not ready at once, streams told to move, calls finished, exit"
        " within this",
    )
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> GatewaySettings:
    bus = BusSettings.from_env()
    if args.redis_url:
        bus = dataclasses.replace(bus, redis_urls=tuple(args.redis_url))
    if args.data_dir:
        bus = dataclasses.replace(bus, data_dir=Path(args.data_dir))
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        ca = Path(args.tls_client_ca) if args.tls_client_ca else None
        tls = TlsSettings(Path(args.tls_cert), Path(args.tls_key), ca)
    return GatewaySettings(
        listen=args.listen,
        secrets=read_secrets(args.secret, args.secret_file),
        principals=principals.load(Path(args.config)) if args.config else (),
        allow_no_auth=args.insecure_no_auth,
        tls=tls,
        allow_plaintext=args.allow_plaintext,
        bus=bus,
        max_message_bytes=args.max_message_bytes,
        max_streams=args.max_streams,
        keepalive_seconds=args.keepalive_seconds,
        grace_seconds=args.drain_seconds,
        http_listen=None if args.http_listen in ("", "off") else args.http_listen,
        http_allowed_hosts=tuple(
            h.strip() for h in args.http_allowed_hosts.split(",") if h.strip()
        ),
        history_seconds=args.history_interval,
        metrics_max_queues=args.metrics_max_queues,
        reuse_port=args.reuse_port,
        fleet_secret=fleet_secret(args.fleet_secret_file),
    )


def fleet_secret(path: str | None) -> str | None:
    if path:
        return read_secret_file(path).strip()
    return os.environ.get("BUSMQ_GATEWAY_FLEET_SECRET") or None


def gc_thresholds(text: str | None) -> tuple[int, ...]:
    """``BUSMQ_GATEWAY_GC_THRESHOLDS`` ("700,10,10": CPython's own), or the gateway's."""
    if not text:
        return GC_THRESHOLDS
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 0:
        raise ValueError(f"BUSMQ_GATEWAY_GC_THRESHOLDS: three counts, e.g. 700,10,10: {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> None:
    cap_malloc_arenas()
    try:
        gc.set_threshold(*gc_thresholds(os.environ.get("BUSMQ_GATEWAY_GC_THRESHOLDS")))
    except ValueError as exc:
        print(f"busmq-gateway: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    args = parse_args(argv)
    logs.configure(args.log_format, args.log_level)
    try:
        settings = settings_from(args)
    except (ValueError, OSError) as exc:
        print(f"busmq-gateway: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.workers > 1:
        from .workers import supervise

        raise SystemExit(asyncio.run(supervise(settings, sys.argv[1:] if argv is None else argv,
                                               args.workers)))  # fmt: skip
    if args.workers < 1:
        print("busmq-gateway: --workers must be at least 1", file=sys.stderr)
        raise SystemExit(2)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
