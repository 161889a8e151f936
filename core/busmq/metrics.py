"""Prometheus metrics of a bus, for any application that runs one.

:class:`BusMetrics` is a ``prometheus_client`` collector. It reports two halves:

- what Redis holds, read at scrape time (:mod:`busmq.inventory`: per queue depth,
  pending, oldest pending age, consumers, delayed, dead letters, pushed and delivered
  totals; per shard state and round-trip time; per federation target link state,
  outbox depth and age, consumer lag, resumes). Reads are cached for
  ``cache_seconds``, so scrapers that come often (or several Prometheus servers) cost
  Redis one read per interval;
- what this process did (:mod:`busmq.stats`): messages pushed, delivered,
  redelivered, acked, retried and rejected, per queue.

Queue labels are bounded: the first ``max_queues`` queue names seen get their own
label, everything else is summed under ``queue="_other"`` (the set is stable while
those queues exist, so counters stay monotonic).

Usage::

    metrics = BusMetrics(bus)
    prometheus_client.REGISTRY.register(metrics)
    prometheus_client.start_http_server(9464)  # scrapes refresh it from that thread

In an asyncio HTTP handler, ``await metrics.refresh()`` before ``generate_latest``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import inventory
from .errors import BusError
from .inventory import QueueStats
from .shard import ShardState
from .stats import KINDS

CLIENT_HELP = {
    "pushed": "Messages this process pushed.",
    "delivered": "Messages this process's consumers received (first or again).",
    "redelivered": "Deliveries after the first, received by this process.",
    "acked": "Deliveries this process acknowledged.",
    "retried": "Deliveries this process gave back for a retry.",
    "rejected": "Deliveries this process rejected to the dead letters.",
}
"""Help of each ``busmq_client_<kind>`` counter (:mod:`busmq.stats` kinds)."""

if TYPE_CHECKING:
    from .bus import Bus
    from .federation.manager import TargetStatus
    from .shard import Shard

OTHER = "_other"
"""The queue label that sums the queues beyond ``max_queues``."""


@dataclass(frozen=True)
class ShardStatus:
    label: str
    online: bool
    ping_seconds: float | None


@dataclass(frozen=True)
class Snapshot:
    """One read of everything the metrics and the dashboard show."""

    taken_at: float
    queues: list[QueueStats]
    shards: list[ShardStatus]
    targets: list[TargetStatus] = field(default_factory=list)
    read_seconds: float = 0.0
    error: str | None = None
    """Why the Redis half could not be read (the rest is still reported)."""


class BusMetrics(Collector):
    """A ``prometheus_client`` collector of one bus (see the module docstring)."""

    def __init__(
        self,
        bus: Bus,
        *,
        max_queues: int = 100,
        cache_seconds: float = 5.0,
        process_figures: bool = True,
    ) -> None:
        """``process_figures=False`` leaves out this process's ``busmq_client_*``
        counters (a process that reports other processes' instead, as a gateway's
        supervisor reports its workers')."""
        if max_queues < 1:
            raise ValueError("max_queues must be at least 1")
        self.bus = bus
        self.process_figures = process_figures
        self.max_queues = max_queues
        self.cache_seconds = cache_seconds
        self._snapshot: Snapshot | None = None
        self._refreshing: asyncio.Task[Snapshot] | None = None
        self._labeled: dict[str, None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()

    # -- reading ------------------------------------------------------------------------

    async def refresh(self, *, force: bool = False) -> Snapshot:
        """The current snapshot, read again if older than ``cache_seconds``; concurrent
        callers share one read."""
        self._loop = asyncio.get_running_loop()
        current = self._snapshot
        if not force and current and time.time() - current.taken_at < self.cache_seconds:
            return current
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._read())
        snapshot = await asyncio.shield(self._refreshing)
        self._snapshot = snapshot
        return snapshot

    async def _read(self) -> Snapshot:
        started = time.perf_counter()
        shards = [await _shard_status(s) for s in self.bus.shards]
        error = None
        queues: list[QueueStats] = []
        try:
            queues = await inventory.all_stats(self.bus.shards)
        except BusError as exc:
            error = str(exc)
        targets: list[TargetStatus] = []
        if self.bus.federation is not None and not self.bus.federation.closed:
            targets = await self.bus.federation.status()
        return Snapshot(time.time(), queues, shards, targets, time.perf_counter() - started, error)

    def _current(self) -> Snapshot | None:
        """The snapshot for a scrape: refreshed through the bus's loop when the scrape
        runs in another thread (``start_http_server``), else the last one read."""
        loop = self._loop
        in_loop = False
        with contextlib.suppress(RuntimeError):
            in_loop = asyncio.get_running_loop() is loop
        if loop is not None and not in_loop and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self.refresh(), loop)
            with contextlib.suppress(Exception):
                return future.result(timeout=self.bus.settings.operation_timeout * 10)
        return self._snapshot

    # -- prometheus_client ----------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        return []  # no read at registration

    def collect(self) -> Iterator[Metric]:
        snapshot = self._current()
        if self.process_figures:
            yield from self._process_metrics()
        if snapshot is None:
            return
        yield from self._queue_metrics(snapshot)
        yield from _shard_metrics(snapshot)
        yield from _federation_metrics(snapshot.targets)

    def label_of(self, queue: str) -> str:
        """The queue label ``queue`` is reported under (itself or ``_other``)."""
        if queue in self._labeled:
            return queue
        if len(self._labeled) < self.max_queues:
            self._labeled[queue] = None
            return queue
        return OTHER

    def _forget_missing(self, present: set[str]) -> None:
        counted = set(self.bus.counters.of("pushed")) | set(self.bus.counters.of("delivered"))
        for name in list(self._labeled):
            if name not in present and name not in counted:
                del self._labeled[name]

    def _queue_metrics(self, snapshot: Snapshot) -> Iterator[Metric]:
        self._forget_missing({q.name for q in snapshot.queues})
        gauges = {
            "messages": "Messages stored in the queue's stream (ready, pending or kept).",
            "depth": "Messages waiting to be delivered.",
            "pending": "At-least-once deliveries not acknowledged yet.",
            "oldest_pending_seconds": "Time since the oldest unacked delivery was handed out.",
            "consumers": "Consumers registered with the queue.",
            "attachments": "Clients holding the queue open.",
            "delayed": "Delayed messages, retries and given-back deliveries to redeliver.",
            "dead_letters": "Messages in the queue's dead-letter queue.",
            "paused": "1 while deliveries are paused.",
        }
        families = {
            name: GaugeMetricFamily(f"busmq_queue_{name}", text, labels=["queue"])
            for name, text in gauges.items()
        }
        pushed = CounterMetricFamily(
            "busmq_queue_pushed",
            "Messages ever pushed to the queue (its last id).",
            labels=["queue"],
        )
        delivered = CounterMetricFamily(
            "busmq_queue_delivered",
            "Hand-outs to the queue's consumer group (Redis 7+).",
            labels=["queue"],
        )
        dead_lettered = CounterMetricFamily(
            "busmq_queue_dead_lettered",
            "Messages ever moved to the queue's dead letters (max deliveries, rejected, expired).",
            labels=["queue"],
        )
        sums: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
        for q in snapshot.queues:
            label = self.label_of(q.name)
            values = sums[label]
            values["messages"] += q.messages
            values["depth"] += q.ready
            values["pending"] += q.pending
            values["oldest_pending_seconds"] = max(
                values["oldest_pending_seconds"], q.oldest_pending_seconds
            )
            values["consumers"] += q.consumers
            values["attachments"] += q.attachments
            values["delayed"] += q.delayed
            values["dead_letters"] += q.dead_letters
            values["paused"] += int(q.paused)
            values["pushed"] += q.last_id
            values["delivered"] += q.delivered
            values["dead_lettered"] += q.dead_lettered
        for label, values in sums.items():
            for name, family in families.items():
                family.add_metric([label], values[name])
            pushed.add_metric([label], values["pushed"])
            delivered.add_metric([label], values["delivered"])
            dead_lettered.add_metric([label], values["dead_lettered"])
        yield from families.values()
        yield pushed
        yield delivered
        yield dead_lettered
        count = GaugeMetricFamily("busmq_queues", "Queues on the bus.")
        count.add_metric([], len(snapshot.queues))
        yield count
        read = GaugeMetricFamily(
            "busmq_metrics_read_seconds", "How long the last read of the bus's figures took."
        )
        read.add_metric([], snapshot.read_seconds)
        yield read
        failed = GaugeMetricFamily(
            "busmq_metrics_read_failed", "1 if the last read of the queues' figures failed."
        )
        failed.add_metric([], int(snapshot.error is not None))
        yield failed

    def _process_metrics(self) -> Iterator[Metric]:
        counters = self.bus.counters
        # Every kind is reported for every queue any kind counted (zeros included), so
        # a rate over a counter that has not moved yet is 0, not absent.
        labels = sorted({self.label_of(q) for kind in KINDS for q in counters.of(kind)})
        for kind in KINDS:
            name, help_text = f"busmq_client_{kind}", CLIENT_HELP[kind]
            family = CounterMetricFamily(name, help_text, labels=["queue"])
            totals: dict[str, int] = dict.fromkeys(labels, 0)
            for queue, value in counters.of(kind).items():
                totals[self.label_of(queue)] += value
            for label, value in totals.items():
                family.add_metric([label], value)
            yield family


async def _shard_status(shard: Shard) -> ShardStatus:
    online = shard.state is ShardState.ONLINE
    ping = None
    if online:
        started = time.perf_counter()
        try:
            await shard.run(lambda c: c.ping(), idempotent=True)
            ping = time.perf_counter() - started
        except BusError:
            online = False
    return ShardStatus(shard.label, online, ping)


def _shard_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    up = GaugeMetricFamily("busmq_shard_up", "1 while the shard answers.", labels=["shard"])
    ping = GaugeMetricFamily(
        "busmq_shard_ping_seconds", "Round trip of a PING to the shard.", labels=["shard"]
    )
    for shard in snapshot.shards:
        up.add_metric([shard.label], int(shard.online))
        if shard.ping_seconds is not None:
            ping.add_metric([shard.label], shard.ping_seconds)
    yield up
    yield ping


def _federation_metrics(targets: list[TargetStatus]) -> Iterator[Metric]:
    from .federation.link import LinkState

    labels = ["target"]
    state = GaugeMetricFamily(
        "busmq_federation_link_state",
        "1 for the link's current state, 0 for the others.",
        labels=["target", "state"],
    )
    up = GaugeMetricFamily("busmq_federation_link_up", "1 while the link is usable.", labels=labels)
    outbox = GaugeMetricFamily(
        "busmq_federation_outbox_messages", "Messages waiting in the outbox.", labels=labels
    )
    age = GaugeMetricFamily(
        "busmq_federation_outbox_age_seconds", "Age of the oldest push waiting.", labels=labels
    )
    lag = GaugeMetricFamily(
        "busmq_federation_lag_messages", "Messages the local consumers are behind.", labels=labels
    )
    lag_seconds = GaugeMetricFamily(
        "busmq_federation_lag_seconds",
        "How far behind the local consumers are, in time.",
        labels=labels,
    )
    resumes = CounterMetricFamily(
        "busmq_federation_resumes", "Streams reopened and resumed after a cut.", labels=labels
    )
    for target in targets:
        for each in LinkState:
            state.add_metric([target.url, each.value], int(each is target.state))
        up.add_metric([target.url], int(target.state.usable))
        outbox.add_metric([target.url], target.outbox_depth)
        age.add_metric([target.url], target.outbox_age)
        lag.add_metric([target.url], target.lag_messages)
        lag_seconds.add_metric([target.url], target.lag_seconds)
        resumes.add_metric([target.url], target.resumes)
    yield from (state, up, outbox, age, lag, lag_seconds, resumes)
