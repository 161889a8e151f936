"""The gateway server: a grpc.aio server with auth, health, reflection and a clean drain."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from busmq import Bus, BusState, Event
from busmq.metrics import BusMetrics
from busmq.security import plaintext_warning
from busmq.v1 import (
    channel_service_pb2,
    channel_service_pb2_grpc,
    persistable_service_pb2,
    persistable_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    request_service_pb2,
    request_service_pb2_grpc,
)

from .access import Access
from .attachments import Attachments
from .auth import AuthInterceptor
from .channel_service import ChannelService
from .config import GatewaySettings
from .fleet import FleetKey, new_gateway_id
from .guard import Guard
from .http import HttpListener
from .malformed import MalformedLog
from .persistable_service import PersistableService
from .queue_service import QueueService
from .relay import Relay
from .request_service import RequestService
from .rpc_metrics import GatewayCollector, RpcMetrics
from .throttle import quiet_client_gone
from .worker_metrics import MULTIPROCESS_ENV, WorkerFigures

log = logging.getLogger(__name__)

SERVICES = (
    queue_service_pb2.DESCRIPTOR.services_by_name["QueueService"].full_name,
    channel_service_pb2.DESCRIPTOR.services_by_name["ChannelService"].full_name,
    persistable_service_pb2.DESCRIPTOR.services_by_name["PersistableService"].full_name,
    request_service_pb2.DESCRIPTOR.services_by_name["RequestService"].full_name,
)


class _Streams(Protocol):
    """What the drain needs of a servicer's streams."""

    @property
    def active_streams(self) -> int: ...

    @property
    def no_streams(self) -> asyncio.Event: ...


class Gateway:
    """The bus served over gRPC. ``await gateway.start()``, ``gateway.port``,
    ``await gateway.stop()`` (drains streams first)."""

    def __init__(self, settings: GatewaySettings, bus: Bus | None = None) -> None:
        self.settings = settings
        self._own_bus = bus is None
        self.bus = bus or Bus(settings.bus)
        self.port = 0
        self._draining = asyncio.Event()
        self.fleet = FleetKey()
        self.relay = Relay(self.bus, new_gateway_id())
        self._attachments = Attachments(self.bus, self.fleet)
        self._health = health.aio.HealthServicer()
        self.queues = QueueService(
            self.bus, settings, self._attachments, self.fleet, self._draining
        )
        self.channels = ChannelService(self.bus, settings, self.fleet, self.relay, self._draining)
        self.persistables = PersistableService(self.bus)
        self.requests = RequestService(self.bus, settings, self.fleet, self.relay, self._draining)
        self.malformed = MalformedLog()
        self._streams: tuple[_Streams, ...] = (
            self.queues,
            self.queues.browses,
            self.queues.push_streams,
            self.channels.streams,
            self.requests.streams,
        )
        self.server: grpc.aio.Server | None = None
        tls = settings.tls
        self.access = Access(
            settings.all_principals,
            open_access=not settings.authenticated,
            mtls=tls is not None and tls.client_ca_file is not None,
            max_streams=settings.max_streams,
        )
        self.registry = CollectorRegistry()
        self.rpc_metrics = RpcMetrics(self.registry)
        self.bus_metrics = BusMetrics(
            self.bus,
            max_queues=settings.metrics_max_queues,
            cache_seconds=settings.metrics_cache_seconds,
        )
        self.registry.register(self.bus_metrics)
        # Read at scrape time, never multiprocess files: a worker publishes these
        # to its supervisor itself (WorkerFigures).
        self.registry.register(
            GatewayCollector(
                self.access,
                lambda: self.active_streams,
                lambda: self.malformed.total,
                lambda: self.relay.relayed,
            )
        )
        self.http: HttpListener | None = None
        self._worker_figures: WorkerFigures | None = None

    def _options(self) -> list[tuple[str, int]]:
        keepalive_ms = int(self.settings.keepalive_seconds * 1000)
        return [
            ("grpc.max_receive_message_length", self.settings.max_message_bytes),
            ("grpc.max_send_message_length", self.settings.max_message_bytes),
            ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # Clients may ping as often as every 10 s on long-lived idle streams.
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
            ("grpc.so_reuseport", int(self.settings.reuse_port)),
            # Calls that arrived before the server asked for the next one (grpc.aio asks
            # one at a time): gRPC cancels those beyond 1,000 (soft) / 3,000 (hard) by
            # default, so a burst of streams (clients reconnecting after a deploy) lost
            # every one past ~1,800 with a bare CANCELLED the gateway never saw.
            ("grpc.server.max_pending_requests", 100_000),
            ("grpc.server.max_pending_requests_hard_limit", 100_000),
        ]

    def registrations(self) -> list[tuple[Callable[[Any, Any], None], Any]]:
        """The busmq services' ``add_*_to_server`` functions and their servicers."""
        return [
            (queue_service_pb2_grpc.add_QueueServiceServicer_to_server, self.queues),
            (channel_service_pb2_grpc.add_ChannelServiceServicer_to_server, self.channels),
            (
                persistable_service_pb2_grpc.add_PersistableServiceServicer_to_server,
                self.persistables,
            ),
            (request_service_pb2_grpc.add_RequestServiceServicer_to_server, self.requests),
        ]

    def guard(self) -> Guard:
        """What admits, checks and counts every call of :meth:`registrations`."""
        return Guard(self.access, self.malformed, self.rpc_metrics, self._draining)

    async def start(self) -> None:
        if self._own_bus:
            # Before gRPC starts its threads: the embedded Redis is a forked child.
            await self.bus.connect()
        await self.fleet.load(self.bus, self.settings.fleet_secret)
        quiet_client_gone()
        interceptors = [AuthInterceptor(self.access)] if self.settings.authenticated else []
        self.server = grpc.aio.server(interceptors=interceptors, options=self._options())
        self.bus.events.on(self._on_bus_event)
        self.guard().add_services(self.server, self.registrations())
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        reflection.enable_server_reflection(
            (*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = self._bind()
        await self.server.start()
        if os.environ.get(MULTIPROCESS_ENV):  # a worker: its supervisor serves /metrics
            self._worker_figures = WorkerFigures(self)
            self._worker_figures.start()
        if self.settings.http_listen is not None:
            self.http = HttpListener(
                self.settings,
                self.access,
                self.bus,
                self.registry,
                self.bus_metrics,
                lambda: not self._draining.is_set(),
            )
            await self.http.start()
        await self._set_health(self.bus.state is BusState.ONLINE)
        if self.settings.plaintext_off_loopback:
            log.warning(plaintext_warning(self.settings.listen))
        log.info(
            "gateway listening on %s:%d (%s, auth %s)",
            self.settings.listen.rsplit(":", 1)[0],
            self.port,
            "tls" if self.settings.tls else "plaintext",
            f"{len(self.settings.secrets)} secret(s)" if self.settings.secrets else "OFF",
        )

    def _bind(self) -> int:
        assert self.server is not None
        listen = self.settings.listen
        tls = self.settings.tls
        if tls is None:
            port: int = self.server.add_insecure_port(listen)
        else:
            cert, key, client_ca = tls.read()
            credentials = grpc.ssl_server_credentials(
                [(key, cert)],
                root_certificates=client_ca,
                require_client_auth=client_ca is not None,
            )
            port = self.server.add_secure_port(listen, credentials)
        if port == 0:
            raise OSError(f"cannot listen on {listen}")
        return port

    async def stop(self) -> None:
        """Drain: end every stream cleanly (at-least-once deliveries in flight are given
        back for redelivery), let unary calls finish within the grace period, close."""
        await self.begin_drain()
        # Streams end first while unary calls are still served, so clients can ack what
        # they were sent; then the listener closes and running calls get the rest.
        half = self.settings.grace_seconds / 2
        try:
            await asyncio.wait_for(
                asyncio.gather(*(s.no_streams.wait() for s in self._streams)), half
            )
        except TimeoutError:
            log.warning("%d stream(s) still open after %.1fs", self.active_streams, half)
        if self.server is not None:
            await self.server.stop(half)
        if self._worker_figures is not None:
            await self._worker_figures.stop()
        await self.requests.close()
        await self.relay.close()
        if self.http is not None:
            await self.http.stop()
        if self._own_bus:
            await self.bus.close()
        log.info("gateway stopped")

    async def begin_drain(self) -> None:
        """The first step of :meth:`stop`: not ready (health, ``/readyz``), every stream
        told to move and ended, new streams refused ``UNAVAILABLE`` (reason
        ``GATEWAY_DRAINING``); unary calls are still served."""
        if self._draining.is_set():
            return
        log.info("draining %d stream(s)", self.active_streams)
        self._draining.set()
        await self._set_health(False)

    @property
    def active_streams(self) -> int:
        return sum(s.active_streams for s in self._streams)

    async def _set_health(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", *SERVICES):
            await self._health.set(service, status)

    async def _on_bus_event(self, event: Event) -> None:
        if event.kind in ("online", "offline") and not self._draining.is_set():
            await self._set_health(self.bus.state is BusState.ONLINE)


async def serve(settings: GatewaySettings) -> None:
    """Run a gateway until SIGTERM or SIGINT, then drain and stop."""
    gateway = Gateway(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    # What the gateway built to start (modules, descriptors, its server) lives as long as
    # the process. Frozen, it is no longer scanned by every full collection: the imports
    # alone are 75,000 objects, 16 ms a full collection here, a pause in every stream.
    gc.collect()
    gc.freeze()
    http = f", http on port {gateway.http.port}" if gateway.http else ""
    print(f"busmq gateway ready on port {gateway.port}{http}", flush=True)
    await stop.wait()
    await gateway.stop()
