"""The gateway's HTTP listener (``--http-listen``): ``/metrics`` for Prometheus,
``/healthz`` and ``/readyz`` for load balancers and orchestrators (503 while the bus is
offline or the gateway drains), and the dashboard (``/``, its scripts under ``/static/``,
its data under ``/api/``: the overview, an hour of charts, the queue pages of
:mod:`busmq_gateway.queue_pages`).

On a loopback address it is open, like a local admin port. Anywhere else it follows the
gRPC port's rules: TLS with the gateway's certificate (or ``--allow-plaintext``), and
every path but those two needs the secret of a principal allowed ``metrics`` (the
simple form's secrets are), as ``Authorization: Bearer <secret>`` (Prometheus's
``authorization`` setting) or as the password of HTTP basic auth (so a browser can open
the dashboard).
"""

from __future__ import annotations

import base64
import logging
import ssl
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from busmq import Bus, BusState
from busmq.metrics import BusMetrics
from busmq.security import is_loopback

from .access import Access
from .config import GatewaySettings
from .history import History
from .overview import Overview
from .queue_pages import QueuePages
from .web_guard import WebGuard

log = logging.getLogger(__name__)

OPEN_PATHS = ("/healthz", "/readyz")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpListener:
    """Serves the registry, health and dashboard of one gateway."""

    def __init__(
        self,
        settings: GatewaySettings,
        access: Access,
        bus: Bus,
        registry: CollectorRegistry,
        bus_metrics: BusMetrics,
        serving: Callable[[], bool],
    ) -> None:
        assert settings.http_listen is not None
        self.listen = settings.http_listen
        self.settings = settings
        self.bus = bus
        self.registry = registry
        self.bus_metrics = bus_metrics
        self.overview = Overview(bus_metrics)
        self.history = History(bus_metrics, settings.history_seconds)
        self._serving = serving
        self._access = access
        self._open = is_loopback(self.listen)
        self._runner: web.AppRunner | None = None
        self._guard = WebGuard(self.listen.rsplit(":", 1)[0], settings.http_allowed_hosts)
        self.port = 0

    async def start(self) -> None:
        app = web.Application(middlewares=[self._guard.middleware, self._auth])
        app.router.add_get("/", self._dashboard)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/readyz", self._health)
        app.router.add_get("/api/overview", self._overview)
        app.router.add_get("/api/links", self._links)
        app.router.add_static("/static/", resources.files("busmq_gateway") / "static")  # type: ignore[arg-type]
        QueuePages(self.bus, self._access, self.history, _presented).register(app.router)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, port = self.listen.rsplit(":", 1)
        site = web.TCPSite(
            self._runner, host.strip("[]"), int(port), ssl_context=self._ssl_context()
        )
        await site.start()
        self.history.start()
        self.port = self._guard.port = int(self._runner.addresses[0][1])
        log.info(
            "http listening on %s:%d (/metrics, /healthz, dashboard; %s)",
            host,
            self.port,
            "open on loopback" if self._open else "secret required",
        )

    async def stop(self) -> None:
        await self.history.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def _ssl_context(self) -> ssl.SSLContext | None:
        tls = self.settings.tls
        if tls is None or self._open:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls.cert_file, tls.key_file)
        return context

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._open or request.path in OPEN_PATHS or self._authorized(request):
            return await handler(request)
        return web.Response(
            status=401,
            text="missing or invalid credentials\n",
            headers={"WWW-Authenticate": 'Basic realm="busmq gateway"'},
        )

    def _authorized(self, request: web.Request) -> bool:
        principal = self._access.for_secret(_presented(request.headers.get("Authorization", "")))
        return principal is not None and principal.metrics

    async def _metrics(self, request: web.Request) -> web.Response:
        await self.bus_metrics.refresh()
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, request: web.Request) -> web.Response:
        if self.bus.state is BusState.ONLINE and self._serving():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not serving\n")

    async def _overview(self, request: web.Request) -> web.Response:
        return web.json_response(await self.overview.read())

    async def _links(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"history_interval": self.history.interval, "links": self.history.links_json()}
        )

    async def _dashboard(self, request: web.Request) -> web.Response:
        page = resources.files("busmq_gateway").joinpath("dashboard.html").read_text()
        return web.Response(text=page, content_type="text/html")


def _presented(header: str) -> bytes:
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip().encode()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except ValueError:
            return b""
        return decoded.partition(b":")[2]
    return b""
