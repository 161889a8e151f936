"""A real nginx (Debian's ``nginx-light``) balancing gRPC calls over several gateways.

Each call goes to the next gateway (round robin), as Envoy, Kubernetes ingresses and
nginx ``grpc_pass`` do in production. The process runs in the foreground on a free
loopback port with its files in a private directory, and is stopped by its PID.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import textwrap
from collections.abc import Sequence
from pathlib import Path

from tests.support.redis_server import free_port

README = Path(__file__).resolve().parents[2] / "README.md"
MAIN = """\
daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{balancer}
}}
"""


def readme_balancer() -> str:
    """The README's nginx block (upstream and server): what the fleet tests run."""
    found = re.search(r"```nginx\n(.*?)```", README.read_text(), re.S)
    assert found, "README.md has no nginx block"
    return found.group(1)


def nginx_config(directory: Path, port: int, upstreams: Sequence[str]) -> str:
    """The README's block with this test's gateways and port, in a main context of the
    test's own (files in ``directory``, in the foreground)."""
    balancer = readme_balancer()
    servers = re.findall(r"^ *server 127\.0\.0\.1:\d+ (.*);$", balancer, re.M)
    assert len(servers) == len(upstreams), "the README's upstream lists three gateways"
    lines = iter(f"server {target} {servers[0]};" for target in upstreams)
    balancer = re.sub(r"server 127\.0\.0\.1:\d+ .*;", lambda _: next(lines), balancer)
    balancer = re.sub(r"listen 127\.0\.0\.1:\d+", f"listen 127.0.0.1:{port}", balancer)
    return MAIN.format(dir=directory, balancer=textwrap.indent(balancer, "    "))


class Nginx:
    def __init__(self, directory: Path, upstreams: Sequence[str]) -> None:
        self.directory = directory
        self.upstreams = list(upstreams)
        self.port = free_port()
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> Nginx:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "nginx.conf"
        conf.write_text(nginx_config(self.directory, self.port, self.upstreams))
        self.process = await asyncio.create_subprocess_exec(
            binary, "-c", str(conf), "-e", str(self.directory / "error.log"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await self._wait_listening()
        return self

    async def _wait_listening(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while True:
                if self.process is not None and self.process.returncode is not None:
                    log = (self.directory / "error.log").read_text(errors="replace")
                    raise RuntimeError(f"nginx exited: {textwrap.shorten(log, 2000)}")
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                except OSError:
                    await asyncio.sleep(0.02)  # polling the port until nginx binds it
                    continue
                writer.close()
                return

    def errors(self) -> str:
        return (self.directory / "error.log").read_text(errors="replace")

    async def __aexit__(self, *exc: object) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGQUIT)  # graceful: finish what is in flight
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
