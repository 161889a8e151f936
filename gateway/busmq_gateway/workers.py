"""``busmq-gateway --workers N``: N gateway processes on one port under one supervisor.

One Python process serves gRPC on one core. The supervisor runs N workers, each a
whole gateway bound to the same port with ``SO_REUSEPORT`` (the kernel spreads new
connections over them; every call of a connection stays on its worker, so a stream
and the acks of its deliveries meet the same consumer). The supervisor

- starts the embedded Redis once when no Redis is configured, and hands its socket to
  the workers;
- holds the port (a bound, non-listening socket with ``SO_REUSEPORT``), so port 0
  resolves once and a restarted worker binds the same port;
- restarts a worker that exits on its own (at most ``MAX_RESTARTS`` within
  ``RESTART_WINDOW`` seconds, then it stops everything and exits 1);
- drains on SIGTERM/SIGINT: every worker gets SIGTERM and drains its streams (clients
  resume on a worker of another gateway, or of this one after a restart); if the
  supervisor itself is killed, each worker gets SIGTERM from the kernel and drains;
- serves the HTTP listener itself: ``/healthz`` (every worker up and Redis online),
  the dashboard and ``/metrics``, where the workers' gRPC metrics are summed by
  prometheus_client's multiprocess mode and the bus's figures are read by the
  supervisor's own bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from busmq import Bus, BusState, EmbeddedRedis
from busmq.embedded import die_with_parent
from busmq.metrics import BusMetrics

from .access import Access
from .config import GatewaySettings
from .http import HttpListener
from .worker_metrics import MULTIPROCESS_ENV

log = logging.getLogger(__name__)

MAX_RESTARTS = 5
RESTART_WINDOW = 30.0
READY = "busmq gateway ready"


class Worker:
    """One gateway process of the supervisor."""

    def __init__(self, index: int, argv: Sequence[str], env: dict[str, str]) -> None:
        self.index = index
        self.argv = list(argv)
        self.env = env
        self.process: asyncio.subprocess.Process | None = None
        self._output: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self, timeout: float = 60.0) -> None:
        # A worker outliving its supervisor would keep serving (and holding the port)
        # with nobody to restart or stop it: it gets SIGTERM, and drains, if that dies.
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, env=self.env, stdout=asyncio.subprocess.PIPE, preexec_fn=die_with_parent
        )
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    raise RuntimeError(f"worker {self.index} exited before it was ready")
                if READY in line.decode(errors="replace"):
                    break
        self._output = asyncio.create_task(self._drain(self.process.stdout))

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            sys.stdout.write(line.decode(errors="replace"))

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.process is not None
            self.process.send_signal(sig)

    async def wait(self) -> int:
        assert self.process is not None
        code = await self.process.wait()
        if self._output is not None:
            await asyncio.gather(self._output, return_exceptions=True)
        return code


class Supervisor:
    def __init__(self, settings: GatewaySettings, argv: Sequence[str], workers: int) -> None:
        if workers < 2:
            raise ValueError("--workers needs at least 2 (1 is the plain gateway)")
        self.settings = settings
        self.argv = list(argv)
        self.count = workers
        self.workers: list[Worker] = []
        self.port = 0
        self.http: HttpListener | None = None
        self._holder: socket.socket | None = None
        self._embedded: EmbeddedRedis | None = None
        self._bus: Bus | None = None
        self._metrics_dir = ""
        self._stopping = False
        self._restarts: list[float] = []
        self._watchers: list[asyncio.Task[None]] = []
        self.failed = asyncio.Event()

    async def start(self) -> None:
        bus_settings = self.settings.bus
        if not bus_settings.redis_urls:
            self._embedded = EmbeddedRedis(bus_settings.data_dir)
            await self._embedded.start()
            bus_settings = dataclasses.replace(bus_settings, redis_urls=(self._embedded.url,))
        self.port = self._hold_port()
        self._metrics_dir = tempfile.mkdtemp(prefix="busmq-gateway-metrics-")
        env = {**os.environ, MULTIPROCESS_ENV: self._metrics_dir}
        for index in range(self.count):
            worker = Worker(index, self._worker_argv(bus_settings.redis_urls), env)
            self.workers.append(worker)
        await asyncio.gather(*(w.start() for w in self.workers))
        self._watchers = [
            asyncio.create_task(self._watch(w), name=f"busmq-worker-{w.index}")
            for w in self.workers
        ]
        self._bus = Bus(dataclasses.replace(self.settings.bus, redis_urls=bus_settings.redis_urls))
        await self._bus.connect()
        if self.settings.http_listen is not None:
            self.http = self._http_listener(self._bus)
            await self.http.start()

    def _hold_port(self) -> int:
        host, port = self.settings.listen.rsplit(":", 1)
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        holder = socket.socket(family, socket.SOCK_STREAM)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((host.strip("[]"), int(port)))
        self._holder = holder
        return int(holder.getsockname()[1])

    def _worker_argv(self, redis_urls: Sequence[str]) -> list[str]:
        host = self.settings.listen.rsplit(":", 1)[0]
        argv = [sys.executable, "-m", "busmq_gateway", *self.argv]
        argv += ["--listen", f"{host}:{self.port}", "--reuse-port", "--http-listen", "off"]
        if not self.settings.bus.redis_urls:
            argv += [arg for url in redis_urls for arg in ("--redis-url", url)]
        return argv

    def _http_listener(self, bus: Bus) -> HttpListener:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self._metrics_dir)  # type: ignore[no-untyped-call]
        metrics = BusMetrics(
            bus,
            max_queues=self.settings.metrics_max_queues,
            cache_seconds=self.settings.metrics_cache_seconds,
            process_figures=False,  # the workers' come summed from their files
        )
        registry.register(metrics)
        Gauge(
            "busmq_gateway_workers_up", "Worker processes serving.", registry=registry
        ).set_function(lambda: sum(w.alive for w in self.workers))
        access = Access(self.settings.all_principals, open_access=not self.settings.authenticated)
        return HttpListener(self.settings, access, bus, registry, metrics, self._serving)

    def _serving(self) -> bool:
        bus_up = self._bus is not None and self._bus.state is BusState.ONLINE
        return bus_up and not self._stopping and all(w.alive for w in self.workers)

    async def _watch(self, worker: Worker) -> None:
        while True:
            code = await worker.wait()
            mark_process_dead(worker.pid, self._metrics_dir)  # type: ignore[no-untyped-call]
            if self._stopping:
                return
            now = time.monotonic()
            self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW] + [now]
            if len(self._restarts) > MAX_RESTARTS:
                log.error("workers keep exiting (%d restarts in %.0f s): stopping", MAX_RESTARTS,
                          RESTART_WINDOW)  # fmt: skip
                self.failed.set()
                return
            log.warning("worker %d (pid %d) exited with %s: restarting it", worker.index,
                        worker.pid, code)  # fmt: skip
            try:
                await worker.start()
            except (RuntimeError, TimeoutError, OSError) as exc:
                log.error("worker %d did not start again: %s", worker.index, exc)
                self.failed.set()
                return

    async def stop(self) -> None:
        """Drain every worker (SIGTERM), then stop the HTTP listener, the bus and the
        embedded Redis."""
        self._stopping = True
        log.info("draining %d worker(s)", sum(w.alive for w in self.workers))
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        deadline = self.settings.grace_seconds + 10
        for worker in self.workers:
            if worker.process is None:
                continue
            try:
                await asyncio.wait_for(worker.wait(), deadline)
            except TimeoutError:
                log.warning("worker %d did not drain in %.0f s: killing it", worker.index, deadline)
                worker.signal(signal.SIGKILL)
                await worker.wait()
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        if self.http is not None:
            await self.http.stop()
        if self._bus is not None:
            await self._bus.close()
        if self._embedded is not None:
            await self._embedded.stop()
        if self._holder is not None:
            self._holder.close()
        shutil.rmtree(self._metrics_dir, ignore_errors=True)
        log.info("gateway stopped")


def strip_workers(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--workers N`` / ``--workers=N`` (the workers' own arguments)."""
    result: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            result.append(arg)
    return result


async def supervise(settings: GatewaySettings, argv: Sequence[str], workers: int) -> int:
    """Run the workers until SIGTERM or SIGINT (exit 0 after the drain), or until they
    keep failing (exit 1)."""
    supervisor = Supervisor(settings, strip_workers(argv), workers)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await supervisor.start()
    except BaseException:
        await supervisor.stop()
        raise
    http = f", http on port {supervisor.http.port}" if supervisor.http else ""
    pids = ", ".join(str(w.pid) for w in supervisor.workers)
    print(f"{READY} on port {supervisor.port}{http} ({workers} workers: pids {pids})", flush=True)
    stopped = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(supervisor.failed.wait())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    for waiter in (stopped, failed):
        waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(stopped, failed)
    await supervisor.stop()
    return 1 if supervisor.failed.is_set() else 0
