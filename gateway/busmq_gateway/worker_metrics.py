"""A worker's own figures, summed on its supervisor's ``/metrics``.

Under ``--workers`` every worker runs with ``PROMETHEUS_MULTIPROC_DIR`` set, so its
prometheus_client counters and histograms (the gRPC ones) are files the supervisor's
``MultiProcessCollector`` sums. The gateway's other per-process figures are read from
plain integers at scrape time in a single process (the core counts per batch, without a
metrics library); a worker serves no ``/metrics`` of its own, so it publishes them
instead, every ``PUBLISH_SECONDS`` and once more when it stops:

* ``busmq_client_<kind>{queue}`` (pushed, delivered, ...), increased by what was counted
  since the last publication, under the worker's own queue label bound;
* ``busmq_gateway_refused_total{principal,reason}`` and
  ``busmq_gateway_relayed_calls_total``, the same way;
* ``busmq_gateway_active_streams`` and ``busmq_gateway_principal_streams{principal}``,
  summed over the live workers (``livesum``);
* ``busmq_gateway_malformed_requests``, summed over every worker that ran (``sum``);
* ``busmq_gateway_asyncio_tasks``, summed over the live workers.

A worker killed outright loses what it counted since its last publication (at most
``PUBLISH_SECONDS``); one that stops cleanly loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from prometheus_client import Counter, Gauge

from busmq import Bus
from busmq.metrics import CLIENT_HELP, BusMetrics
from busmq.stats import KINDS

from .access import Access
from .malformed import MalformedLog
from .relay import Relay
from .rpc_metrics import (
    ACTIVE_STREAMS,
    ASYNCIO_TASKS,
    MALFORMED_REQUESTS,
    PRINCIPAL_STREAMS,
    REFUSED,
    RELAYED,
)


class Published(Protocol):
    """The figures a worker publishes, as a gateway holds them (a
    :class:`~busmq_gateway.server.Gateway` is one)."""

    bus: Bus
    bus_metrics: BusMetrics
    access: Access
    malformed: MalformedLog
    relay: Relay

    @property
    def active_streams(self) -> int: ...


PUBLISH_SECONDS = 1.0
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


class WorkerFigures:
    """Publishes one worker gateway's per-process figures (see the module docstring)."""

    def __init__(self, gateway: Published) -> None:
        self._gateway = gateway
        self._client = {
            kind: Counter(f"busmq_client_{kind}", CLIENT_HELP[kind], ["queue"], registry=None)
            for kind in KINDS
        }
        self._refused = Counter(*REFUSED, ["principal", "reason"], registry=None)
        self._active = Gauge(*ACTIVE_STREAMS, multiprocess_mode="livesum", registry=None)
        self._principal_streams = Gauge(
            *PRINCIPAL_STREAMS, ["principal"], multiprocess_mode="livesum", registry=None
        )
        self._malformed = Gauge(*MALFORMED_REQUESTS, multiprocess_mode="sum", registry=None)
        self._relayed = Counter(*RELAYED, registry=None)
        self._tasks = Gauge(*ASYNCIO_TASKS, multiprocess_mode="livesum", registry=None)
        self._published: dict[tuple[str, ...], int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="busmq-worker-figures")

    async def stop(self) -> None:
        """Stop publishing, after one last publication."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.publish()

    async def _run(self) -> None:
        while True:
            self.publish()
            await asyncio.sleep(PUBLISH_SECONDS)

    def publish(self) -> None:
        gateway = self._gateway
        counters = gateway.bus.counters
        label_of = gateway.bus_metrics.label_of
        for kind, counter in self._client.items():
            totals: dict[str, int] = {}
            for queue, value in counters.of(kind).items():
                label = label_of(queue)
                totals[label] = totals.get(label, 0) + value
            for label, total in totals.items():
                self._advance(counter, (kind, label), total, label)
        for (name, reason), total in gateway.access.refusals.totals.items():
            self._advance(self._refused, ("refused", name, reason), total, name, reason)
        self._active.set(gateway.active_streams)
        for principal in gateway.access.principals:
            streams = gateway.access.streams_of(principal.name)
            self._principal_streams.labels(principal.name).set(streams)
        self._malformed.set(gateway.malformed.total)
        self._advance(self._relayed, ("relayed",), gateway.relay.relayed)
        self._tasks.set(len(asyncio.all_tasks()))

    def _advance(self, counter: Counter, key: tuple[str, ...], total: int, *labels: str) -> None:
        """Increase ``counter{labels}`` to ``total`` (what was counted since the last
        publication)."""
        delta = total - self._published.get(key, 0)
        if delta > 0:
            counter.labels(*labels).inc(delta)
            self._published[key] = total
