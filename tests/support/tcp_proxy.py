"""A loopback TCP proxy that tests can cut and restore, to break a link on purpose.

``async with TcpProxy(upstream_port) as proxy:`` listens on ``127.0.0.1:proxy.port`` and
forwards every connection to ``127.0.0.1:upstream_port``. ``cut()`` closes every
connection (both sides see a reset) and stops accepting (new connections are refused);
``restore()`` accepts again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.support.redis_server import free_port

_CHUNK = 64 * 1024


class TcpProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self.connections = 0
        """Connections accepted so far."""
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def accepting(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, "127.0.0.1", self.port, reuse_address=True
            )

    async def restore(self) -> None:
        """Accept connections again (on the same port)."""
        await self.start()

    async def cut(self) -> None:
        """Stop accepting and drop every open connection at once."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in tuple(self._writers):
            transport = writer.transport
            if not transport.is_closing():
                transport.abort()
        self._writers.clear()
        tasks = tuple(self._pipes)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def stop(self) -> None:
        await self.cut()

    async def __aenter__(self) -> TcpProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()  # upstream down: the client sees a reset
            return
        if self._server is None:
            # Cut while the upstream connection was being made: cut() did not see this
            # one, and its wait_closed() waits for every accepted connection to end.
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self.connections += 1
        self._writers.update((writer, up_writer))
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)
            for w in (writer, up_writer):
                self._writers.discard(w)
                if not w.transport.is_closing():
                    w.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
