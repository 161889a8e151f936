"""The shard's own connections (``busmq.mux``: the auto-pipelined hot-path connection
and the notifier's subscription): every URL form, the handshake, losses, timeouts and
the script cache.

Each test runs real ``redis-server`` processes. Consumers run with a long
``block_seconds`` where a delivery must prove that the notifier's subscription works:
then only a publication, not the periodic tick, can wake them in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions as rex

from busmq import Bus, BusTimeoutError, BusUnavailableError, Event, Mode
from busmq.keys import QueueKeys
from busmq.mux import Endpoint, MuxClient, ReplyTimeoutError
from tests.conftest import fast_settings
from tests.support.certs import make_pki
from tests.support.redis_server import RedisServer, Tls
from tests.support.waiting import eventually

pytestmark = pytest.mark.also_on_uvloop  # the same tests on uvloop's event loop

MakeBus = Callable[..., Awaitable[Bus]]
NO_TICK = 60.0  # block_seconds: the notifier's tick never fires within a test
PROMPT = 5.0  # seconds within which a notified consumer must have its message


@contextlib.asynccontextmanager
async def bus_on(url: str, **settings: Any) -> AsyncIterator[Bus]:
    """A bus on ``url`` whose consumers only wake up on notifications (closed before
    the test's server stops)."""
    async with Bus(fast_settings([url], **{"block_seconds": NO_TICK, **settings})) as bus:
        yield bus


@contextlib.asynccontextmanager
async def other_process(bus: Bus) -> AsyncIterator[Bus]:
    """A second bus like ``bus``, standing for another process: its pushes cannot nudge
    ``bus``'s consumers (a push wakes a waiting consumer of its own process, see
    ``Notifier.nudge``), so only ``bus``'s notifier can bring them what it pushes."""
    async with Bus(bus.settings) as other:
        yield other


async def push_then_receive(
    bus: Bus, server: RedisServer, name: str, values: list[bytes]
) -> list[bytes]:
    """Start an at-most-once consumer, push ``values`` once the notifier subscribed to
    the queue, and return what the consumer got."""
    queue = bus.queue(name)
    await queue.attach()
    admin = server.client()
    try:
        async with queue.consume(Mode.AT_MOST_ONCE, max=len(values)) as consumer:
            await eventually(subscribed(admin, name), what="notifier subscribed")
            async with other_process(bus) as pusher:
                await pusher.queue(name).push_batch(values)
            async with asyncio.timeout(PROMPT):
                return [d.payload async for d in consumer]
    finally:
        await admin.aclose()


async def client_list(server: RedisServer, kind: str | None = None) -> list[dict[str, Any]]:
    admin = server.client()
    try:
        clients: list[dict[str, Any]] = await admin.client_list(_type=kind)
        me = await admin.client_id()
    finally:
        await admin.aclose()
    return [c for c in clients if int(c["id"]) != me]


def mux_client(url: str, **timeouts: float) -> MuxClient:
    """The hot-path client as a shard builds it, from a redis-py pool of ``url``."""
    endpoint = Endpoint.from_pool(aioredis.ConnectionPool.from_url(url), "test")
    return MuxClient(
        endpoint,
        reply_timeout=timeouts.get("reply_timeout", 5.0),
        connect_timeout=timeouts.get("connect_timeout", 5.0),
    )


# -- URL forms and the handshake ------------------------------------------------------------


def test_endpoint_takes_what_redis_py_parsed_from_each_url_form() -> None:
    def endpoint(url: str) -> Endpoint:
        return Endpoint.from_pool(aioredis.ConnectionPool.from_url(url), "shard")

    unix = endpoint("unix://:pw@/run/redis.sock?db=2&client_name=app")
    assert (unix.path, unix.db, unix.password, unix.client_name) == (
        "/run/redis.sock",
        2,
        "pw",
        "app",
    )
    assert unix.handshake() == [(b"AUTH", "pw"), (b"CLIENT", b"SETNAME", "app"), (b"SELECT", 2)]
    assert unix.handshake(select=False) == [(b"AUTH", "pw"), (b"CLIENT", b"SETNAME", "app")]

    user = endpoint("redis://alice:p%40ss@db.example:7000/5")
    assert (user.host, user.port, user.db, user.tls) == ("db.example", 7000, 5, None)
    assert user.handshake() == [(b"AUTH", "alice", "p@ss"), (b"SELECT", 5)]
    assert "p@ss" not in repr(user)

    plain = endpoint("redis://cache")
    assert (plain.port, plain.db, plain.handshake()) == (6379, 0, [])

    tls = endpoint("rediss://cache:6380?ssl_cert_reqs=none")
    assert tls.tls is not None and tls.tls.get().check_hostname is False
    strict = endpoint("rediss://cache:6380")
    assert strict.tls is not None and strict.tls.get().check_hostname is True


async def test_password_only_auth_on_every_connection(tmp_path: Path) -> None:
    async with RedisServer(tmp_path / "redis", password="s3cret/+@") as server:
        async with bus_on(server.url) as bus:
            assert await push_then_receive(bus, server, "auth", [b"a", b"b"]) == [b"a", b"b"]

        wrong = server.url.replace("s3cret", "wrong")
        client = mux_client(wrong)
        try:
            with pytest.raises(rex.AuthenticationError):
                await client.execute(b"PING")
        finally:
            await client.aclose()
        refused = Bus(fast_settings([wrong]))
        try:
            with pytest.raises(BusUnavailableError):
                await refused.connect(wait=0.5)
        finally:
            await refused.close()


async def test_acl_user_database_and_client_name_reach_every_connection(
    tmp_path: Path,
) -> None:
    async with RedisServer(tmp_path / "redis", username="alice", password="pw") as server:
        async with bus_on(server.url + "/3?client_name=busmq-test") as bus:
            assert await push_then_receive(bus, server, "acl", [b"x"]) == [b"x"]
            clients = await client_list(server)
        notifier = [c for c in clients if c["cmd"] in ("subscribe", "unsubscribe")]
        assert len(notifier) == 1 and len(clients) >= 3  # and the pool's, the hot path's
        for client in clients:
            assert (client["user"], client["name"]) == ("alice", "busmq-test"), client
            if client not in notifier:  # pub/sub does not depend on the database
                assert client["db"] == "3", client
        db3 = server.client(db=3)
        try:
            assert await db3.exists(QueueKeys("acl").info) == 1
        finally:
            await db3.aclose()


async def test_unix_socket_with_a_database(tmp_path: Path, make_bus: MakeBus) -> None:
    async with RedisServer(tmp_path / "redis", unix_socket=True) as server:
        assert server.url.startswith("unix://")
        bus = await make_bus([server.url + "?db=2"], block_seconds=NO_TICK)
        assert await push_then_receive(bus, server, "local", [b"1", b"2", b"3"]) == [
            b"1",
            b"2",
            b"3",
        ]
        db2 = server.client(db=2)
        try:
            assert await db2.exists(QueueKeys("local").info) == 1
        finally:
            await db2.aclose()


async def test_tls_with_the_pools_ssl_parameters(tmp_path: Path) -> None:
    ca, server_pem, _ = make_pki(tmp_path)
    # Clients must show a certificate: the client cert named in the URL must reach the
    # hot-path connection and the notifier, not only redis-py's pool.
    tls = Tls(cert=server_pem.cert, key=server_pem.key, ca=ca.cert, client_ca=True)
    async with RedisServer(tmp_path / "redis", tls=tls, password="pw") as server:
        assert server.url.startswith("rediss://") and "ssl_certfile" in server.url
        async with bus_on(server.url) as bus:
            assert await push_then_receive(bus, server, "secure", [b"t"]) == [b"t"]

        client = mux_client(server.url.split("?")[0])  # does not trust the server's CA
        try:
            with pytest.raises(rex.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.execute(b"PING")
        finally:
            await client.aclose()


async def test_tls_under_strict_certificate_verification(tmp_path: Path) -> None:
    # What Python 3.13's ssl.create_default_context() turns on (VERIFY_X509_STRICT), set
    # explicitly so every Python checks it: the test PKI must look like a real CA's.
    ca, server_pem, client_pem = make_pki(tmp_path)
    tls = Tls(cert=server_pem.cert, key=server_pem.key, ca=ca.cert, client_ca=True)
    async with RedisServer(tmp_path / "redis", tls=tls) as server:
        context = ssl.create_default_context(cafile=str(ca.cert))
        context.verify_flags |= ssl.VERIFY_X509_STRICT
        context.load_cert_chain(str(client_pem.cert), str(client_pem.key))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=context)
        try:
            writer.write(b"PING\r\n")
            assert await reader.readline() == b"+PONG\r\n"
        finally:
            writer.close()
            await writer.wait_closed()


# -- losses and timeouts ----------------------------------------------------------------------


async def test_lost_connection_fails_pending_calls_and_resends_nothing(
    redis_server: RedisServer,
) -> None:
    mux = mux_client(redis_server.url)
    try:
        assert await mux.execute(b"PING") == b"PONG"
        blocked = asyncio.ensure_future(mux.execute(b"BLPOP", "list", 0))
        behind = asyncio.ensure_future(mux.execute(b"INCR", "counter"))  # queued behind it

        async def blocked_in_redis() -> bool:
            return any(c["cmd"] == "blpop" for c in await client_list(redis_server))

        await eventually(blocked_in_redis, what="BLPOP blocked in Redis")
        admin = redis_server.client()
        try:
            victim = next(c for c in await client_list(redis_server) if c["cmd"] == "blpop")
            await admin.client_kill_filter(_id=victim["id"])
            for call in (blocked, behind):
                with pytest.raises(rex.ConnectionError):
                    await asyncio.wait_for(call, PROMPT)
            # The next call connects again; neither lost call was sent a second time.
            assert await mux.execute(b"INCR", "counter") == 1
            await admin.rpush("list", "kept")
            assert await admin.llen("list") == 1
            assert not any(c["cmd"] == "blpop" for c in await client_list(redis_server))
        finally:
            await admin.aclose()
    finally:
        await mux.aclose()


@pytest.fixture
async def connected(redis_server: RedisServer) -> AsyncIterator[tuple[MuxClient, aioredis.Redis]]:
    """A connected hot-path client, and an admin client on another connection."""
    mux = mux_client(redis_server.url)
    admin = redis_server.client()
    try:
        await mux.execute(b"CLIENT", b"SETNAME", b"hot-path")
        yield mux, admin
    finally:
        await admin.aclose()
        await mux.aclose()


async def test_a_deferred_command_rides_with_the_next_call_and_its_reply_is_skipped(
    connected: tuple[MuxClient, aioredis.Redis],
) -> None:
    mux, _ = connected
    await mux.execute(b"SET", "k", "1")
    mux.defer(b"INCR", "k")
    mux.defer(b"LPUSH", "k", "x")  # WRONGTYPE: an error reply nobody sees
    # The next call's reply is its own, though two replies came before it.
    assert await mux.execute(b"GET", "k") == b"2"
    assert await mux.execute(b"PING") == b"PONG"


async def test_a_deferred_command_goes_out_on_its_own_when_the_connection_is_idle(
    connected: tuple[MuxClient, aioredis.Redis],
) -> None:
    mux, admin = connected
    mux.defer(b"SET", "idle", "1")
    await eventually(lambda: admin.exists("idle"), timeout=2.0, what="the deferred SET")  # type: ignore[arg-type,return-value]


async def test_flush_deferred_returns_once_redis_applied_them(
    connected: tuple[MuxClient, aioredis.Redis],
) -> None:
    mux, admin = connected
    mux.defer(b"SET", "flushed", "1")
    await mux.flush_deferred()
    assert await admin.get("flushed") == b"1"  # on another connection
    await mux.flush_deferred()  # nothing deferred: returns at once


async def test_flush_deferred_waits_for_those_already_sent_but_not_yet_applied(
    connected: tuple[MuxClient, aioredis.Redis],
) -> None:
    mux, admin = connected
    # Held up behind a blocking command, as behind a busy connection's earlier calls.
    mux.defer(b"BLPOP", "nothing", "0.3")
    mux.defer(b"SET", "in-flight", "1")
    protocol = mux._protocol
    assert protocol is not None
    protocol.send_deferred(wait=False)  # as the timer or a request sends them
    await mux.flush_deferred()
    assert await admin.get("in-flight") == b"1"  # on another connection


async def test_deferred_commands_are_dropped_quietly_with_a_lost_connection(
    connected: tuple[MuxClient, aioredis.Redis], redis_server: RedisServer
) -> None:
    mux, admin = connected
    mux.defer(b"SET", "lost", "1")
    victim = next(c for c in await client_list(redis_server) if c["name"] == "hot-path")
    await admin.client_kill_filter(_id=victim["id"])
    with contextlib.suppress(rex.ConnectionError):
        await mux.execute(b"PING")  # may still find the connection open, then fail
    await mux.flush_deferred()  # no error either
    assert await mux.execute(b"PING") == b"PONG"  # a new connection


async def test_overdue_reply_drops_the_connection_with_a_timeout(
    redis_server: RedisServer,
) -> None:
    mux = mux_client(redis_server.url, reply_timeout=0.3)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        with pytest.raises(ReplyTimeoutError):
            await mux.execute(b"BLPOP", "nothing", 0)
        assert 0.3 <= loop.time() - started < 2.0
        assert await mux.execute(b"PING") == b"PONG"  # a new connection
    finally:
        await mux.aclose()


async def test_stalled_redis_fails_hot_calls_within_the_operation_timeout(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url], operation_timeout=0.5)
    events: list[str] = []
    bus.events.on(lambda event: events.append(event.kind))
    queue = bus.queue("stalled")
    await queue.attach()
    assert await queue.push(b"before") == 1
    loop = asyncio.get_running_loop()
    redis_server.signal(signal.SIGSTOP)  # alive but silent: no reset, no EOF
    try:
        started = loop.time()
        with pytest.raises(BusTimeoutError):
            await queue.push(b"lost in the stall")
        assert loop.time() - started < 1.5
        await eventually(lambda: "offline" in events, what="the health monitor noticed")
    finally:
        redis_server.signal(signal.SIGCONT)
    await eventually(lambda: events[-1] == "online", what="back online")
    assert await queue.push(b"after") >= 2


async def test_connection_loss_maps_to_bus_unavailable_and_recovers(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url], block_seconds=NO_TICK)
    events: list[Event] = []
    bus.events.on(events.append)
    queue = bus.queue("cut")
    await queue.attach()
    await queue.push(b"first")
    admin = redis_server.client()
    try:
        # Kill every normal connection (the pool's and the hot path's), not the notifier.
        await admin.client_kill_filter(_type="normal", skipme=True)
    finally:
        await admin.aclose()

    # A push on the dead connection fails at once (it may have been applied), or, if
    # the loss was seen first, waits for the shard and succeeds: never sent twice.
    results = await asyncio.gather(queue.push(b"second"), return_exceptions=True)
    assert all(isinstance(r, int | BusUnavailableError) for r in results), results
    await eventually(
        lambda: [e.kind for e in events if e.kind in ("online", "offline")][-1:] != ["offline"],
        what="shard online",
    )
    ids = [await queue.push(b"third")]
    assert ids[0] >= 2
    assert await queue.count() == ids[0] - (0 if isinstance(results[0], int) else 1)


# -- scripts and the notifier -----------------------------------------------------------------


async def test_scripts_are_loaded_again_after_script_flush(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url])
    queue = bus.queue("flushed")
    await queue.attach()
    assert await queue.push_batch([b"a", b"b"]) == [1, 2]
    admin = redis_server.client()
    try:
        await admin.script_flush()
        assert await queue.push(b"c") == 3  # NOSCRIPT, then SCRIPT LOAD and EVALSHA
        await admin.script_flush()
        async with queue.consume(Mode.AT_LEAST_ONCE, max=3) as consumer:
            got = [d async for d in consumer]
        await admin.script_flush()
        assert await queue.ack(*[d.id for d in got]) == 3
        assert [d.payload for d in got] == [b"a", b"b", b"c"]
        assert await queue.count() == 0
    finally:
        await admin.aclose()


async def test_notifier_resubscribes_after_losing_its_connection(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url], block_seconds=NO_TICK)
    queue = bus.queue("resubscribed")
    await queue.attach()
    admin = redis_server.client()
    try:
        async with queue.consume(Mode.AT_MOST_ONCE) as consumer:
            await eventually(subscribed(admin, queue.name), what="subscribed")
            assert await admin.client_kill_filter(_type="pubsub") == 1
            await eventually(subscribed(admin, queue.name), what="subscribed again")
            async with other_process(bus) as pusher:
                await pusher.queue(queue.name).push(b"notified")
            delivery = await asyncio.wait_for(consumer.__anext__(), PROMPT)
            assert delivery.payload == b"notified"
    finally:
        await admin.aclose()


async def test_notifier_wakes_every_watcher_after_a_reconnect(
    redis_server: RedisServer, make_bus: MakeBus
) -> None:
    bus = await make_bus([redis_server.url], block_seconds=NO_TICK)
    queues = [bus.queue(f"missed.{i}") for i in range(3)]
    admin = redis_server.client()
    consumers = []
    pusher = await make_bus([redis_server.url], block_seconds=NO_TICK)  # another process
    try:
        for queue in queues:
            await queue.attach()
            consumers.append(await queue.consume(Mode.AT_MOST_ONCE).__aenter__())
        for queue in queues:
            await eventually(subscribed(admin, queue.name), what="subscribed")
        warm = pusher.queue("warm-up")  # its connections open before Redis refuses clients
        await warm.attach()
        await warm.push(b"x")
        # Keep the notifier out (Redis refuses new clients), then push: nobody hears
        # the publications. Only the wake-up after its reconnect gets them read.
        clients = len(await admin.client_list())
        await admin.config_set("maxclients", clients - 1)
        assert await admin.client_kill_filter(_type="pubsub") == 1
        for queue in queues:
            await pusher.queue(queue.name).push(b"while away")
        assert all(
            int(n) == 0
            for _, n in await admin.pubsub_numsub(
                *[QueueKeys(q.name).notify_channel for q in queues]
            )
        )
        await admin.config_set("maxclients", 10_000)
        for consumer in consumers:
            delivery = await asyncio.wait_for(consumer.__anext__(), PROMPT)
            assert delivery.payload == b"while away"
    finally:
        for consumer in consumers:
            await consumer.close()
        await admin.aclose()


def subscribed(admin: aioredis.Redis, queue: str) -> Callable[[], Awaitable[bool]]:
    channel = QueueKeys(queue).notify_channel

    async def check() -> bool:
        ((_, count),) = await admin.pubsub_numsub(channel)
        return int(count) > 0

    return check


async def test_a_test_server_that_never_becomes_ready_is_stopped(tmp_path: Path) -> None:
    # PING renamed away: the readiness probe is refused until its deadline.
    server = RedisServer(tmp_path / "unready", extra_args=("--rename-command", "PING", ""))
    with pytest.raises(RuntimeError, match="not ready"):
        await server.start(timeout=0.5)
    assert server.process is None  # stopped, and its pid reaped
