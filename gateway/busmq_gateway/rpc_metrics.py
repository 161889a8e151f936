"""gRPC server metrics in the conventional names (``grpc_server_started_total``,
``grpc_server_handled_total``, ``grpc_server_handling_seconds``) by service, method and
status code, kept in the gateway's own registry.

The label children are cached per (method, code), so a call costs two dict lookups,
an increment and a histogram observation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .access import Access
from .allocator import malloc_bytes

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Unary calls of the gateway take from a fraction of a millisecond (a push) to seconds
(a call waiting for a service); streams are observed for their whole life."""


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        self._started = Counter("grpc_server_started", "RPCs started.", labels, registry=registry)
        self._handled = Counter(
            "grpc_server_handled",
            "RPCs completed, by status code.",
            [*labels, "grpc_code"],
            registry=registry,
        )
        self._seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from the start of an RPC to its end (a stream's whole life).",
            [*labels, "grpc_code"],
            buckets=BUCKETS,
            registry=registry,
        )
        self._cache: dict[tuple[str, str], tuple[Callable[[], None], Callable[[float], None]]] = {}
        self._starts: dict[str, Callable[[], None]] = {}

    def start(self, kind: str, method: str) -> float:
        """Count a started call of ``method`` (``/pkg.Service/Method``); returns the
        start time to give to :meth:`done`."""
        inc = self._starts.get(method)
        if inc is None:
            inc = self._starts[method] = self._started.labels(kind, *_split(method)).inc
        inc()
        return time.perf_counter()

    def done(self, kind: str, method: str, code: grpc.StatusCode | None, started: float) -> None:
        name = (code or grpc.StatusCode.OK).name
        cached = self._cache.get((method, name))
        if cached is None:
            labels = (kind, *_split(method), name)
            cached = self._cache[(method, name)] = (
                self._handled.labels(*labels).inc,
                self._seconds.labels(*labels).observe,
            )
        cached[0]()
        cached[1](time.perf_counter() - started)


def _split(method: str) -> tuple[str, str]:
    service, _, name = method.strip("/").partition("/")
    return service, name


ACTIVE_STREAMS = (
    "busmq_gateway_active_streams",
    "Open streams: deliveries, channels, services, browses and pushes.",
)
MALFORMED_REQUESTS = (
    "busmq_gateway_malformed_requests",
    "Requests refused as malformed since start.",
)
REFUSED = (
    "busmq_gateway_refused",
    "Calls refused by principal and reason (PERMISSION_DENIED, STREAM_LIMIT, ...).",
)
PRINCIPAL_STREAMS = ("busmq_gateway_principal_streams", "Open streams per principal.")
ASYNCIO_TASKS = (
    "busmq_gateway_asyncio_tasks",
    "Tasks alive in the gateway's event loop (level under churn; growth is a leak).",
)
MALLOC_BYTES = (
    "busmq_gateway_malloc_bytes",
    "This process's C allocator (glibc): bytes in use, and bytes freed and kept for reuse "
    "(no leak; an RSS that grows while in_use stays level is that).",
)
RELAYED = (
    "busmq_gateway_relayed_calls",
    "Calls relayed to the fleet's gateway that holds their stream (Reply, channel calls).",
)
"""Name and help of the gateway's own figures, shared with the workers' publication."""


class GatewayCollector(Collector):
    """The gateway's own figures, read at scrape time in a single process: open streams
    (all, and per principal), malformed requests, and refusals per principal and reason.
    (A worker under ``--workers`` publishes the same names to its supervisor instead:
    :mod:`busmq_gateway.worker_metrics`.)"""

    def __init__(
        self,
        access: Access,
        active_streams: Callable[[], int],
        malformed: Callable[[], int],
        relayed: Callable[[], int] = lambda: 0,
    ) -> None:
        self.access = access
        self.active_streams = active_streams
        self.malformed = malformed
        self.relayed = relayed

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        active = GaugeMetricFamily(*ACTIVE_STREAMS)
        active.add_metric([], self.active_streams())
        yield active
        malformed = GaugeMetricFamily(*MALFORMED_REQUESTS)
        malformed.add_metric([], self.malformed())
        yield malformed
        refused = CounterMetricFamily(*REFUSED, labels=["principal", "reason"])
        for (name, reason), count in sorted(self.access.refusals.totals.items()):
            refused.add_metric([name, reason], count)
        yield refused
        streams = GaugeMetricFamily(*PRINCIPAL_STREAMS, labels=["principal"])
        for principal in self.access.principals:
            streams.add_metric([principal.name], self.access.streams_of(principal.name))
        yield streams
        relayed = CounterMetricFamily(*RELAYED)
        relayed.add_metric([], self.relayed())
        yield relayed
        tasks = GaugeMetricFamily(*ASYNCIO_TASKS)
        tasks.add_metric([], _tasks())
        yield tasks
        allocator = malloc_bytes()
        if allocator is not None:
            bytes_ = GaugeMetricFamily(*MALLOC_BYTES, labels=["state"])
            bytes_.add_metric(["in_use"], allocator.in_use)
            bytes_.add_metric(["free"], allocator.free)
            yield bytes_


def _tasks() -> int:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # scraped from outside the loop's thread: nothing to count
        return 0
