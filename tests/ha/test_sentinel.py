"""Sentinel shards: URL forms, start-up errors, durability levels, and the bus's objects
(queues, channels, services, persistables, the gateway) on a Sentinel-managed master.
Real master, replicas and Sentinels (``tests/support/sentinel.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from busmq import (
    Bus,
    BusSettings,
    BusUnavailableError,
    Durability,
    DurabilityError,
    DurabilityUnsupportedError,
    Mode,
    TopologyError,
)
from busmq.topology import mask_url, parse_sentinel_url, split_urls
from tests.conftest import fast_settings
from tests.ha.scenarios import queue_channel_service_and_persistable
from tests.support.gateway_process import gateway_and_remote_bus
from tests.support.redis_server import RedisServer, free_port
from tests.support.sentinel import SERVICE, SentinelGroup

pytestmark = pytest.mark.usefixtures("collect_sentinel_leaks")

MakeBus = Callable[..., Awaitable[Bus]]


# -- URL forms (pure) ---------------------------------------------------------------------


def test_sentinel_url_names_sentinels_service_db_and_logins() -> None:
    target = parse_sentinel_url(
        "redis+sentinel://app:s3cret@10.0.0.1:26379,10.0.0.2:26380/orders"
        "?db=2&sentinel_password=sp&client_name=web"
    )
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (target.service, target.db, target.client_name) == ("orders", 2, "web")
    assert (target.username, target.password) == ("app", "s3cret")
    assert target.sentinel_password == "sp"
    assert not target.tls and not target.sentinel_tls
    tls = parse_sentinel_url("rediss+sentinel://h:1/m?ssl_ca_certs=/ca.pem&sentinel_ssl=no")
    assert tls.tls and not tls.sentinel_tls and tls.ssl_options == (("ssl_ca_certs", "/ca.pem"),)


def test_url_lists_keep_a_sentinel_host_list_whole() -> None:
    text = "redis+sentinel://h1:1,h2:2/svc, redis://other:6379 ,rediss+sentinel://h3:3,h4:4/b"
    assert split_urls(text) == (
        "redis+sentinel://h1:1,h2:2/svc",
        "redis://other:6379",
        "rediss+sentinel://h3:3,h4:4/b",
    )
    settings = BusSettings.from_env({"BUSMQ_REDIS_URLS": text})
    assert settings.redis_urls == split_urls(text)


def test_sentinel_identity_does_not_depend_on_order_or_logins() -> None:
    a = parse_sentinel_url("redis+sentinel://u:p@h1:1,h2:2/m").identity
    b = parse_sentinel_url("redis+sentinel://h2:2,h1:1/m").identity
    assert a == b
    assert parse_sentinel_url("redis+sentinel://h1:1,h2:2/other").identity != a


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel://h:26379", "service name"),
        ("redis+sentinel://h:26379/", "service name"),
        ("redis+sentinel:///m", "names no Sentinel"),
        ("redis+sentinel://h/m", "not host:port"),
        ("redis+sentinel://h:notaport/m", "not host:port"),
        ("redis+sentinel://h:1,h:1/m", "twice"),
        ("redis+sentinel://h:1/m?db=x", "db must be"),
        ("redis+sentinel://h:1/m?sentinel_ssl=maybe", "yes or no"),
        ("redis+sentinel://h:1/m?colour=blue", "unknown option"),
        ("redis+sentinel://h:1/m?ssl_ca_certs=/x", "ssl_\\* options need"),
        ("redis+proxy://h:1", "unsupported Redis URL scheme"),
        ("sentinel://h:1/m", "unsupported Redis URL scheme"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        BusSettings(redis_urls=(url,))


def test_passwords_are_masked_in_urls() -> None:
    shown = mask_url("redis+sentinel://app:s3cret@h:1,h:2/m?sentinel_password=sp&db=1")
    assert "s3cret" not in shown and "sp&" not in shown
    assert shown == "redis+sentinel://app:***@h:1,h:2/m?sentinel_password=***&db=1"


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("async", Durability()),
        ("replicas=2", Durability(replicas=2)),
        ("fsync", Durability(fsync=True)),
        ("fsync,replicas=1", Durability(replicas=1, fsync=True)),
    ],
)
def test_durability_levels_parse_and_print(text: str, level: Durability) -> None:
    assert Durability.parse(text) == level
    assert str(level) == text
    assert BusSettings.from_env({"BUSMQ_DURABILITY": text}).durability == level


@pytest.mark.parametrize("text", ["replicas=0", "replicas=x", "sync", "fsync,always"])
def test_bad_durability_levels_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"durability|replicas"):
        Durability.parse(text)


# -- start-up errors ----------------------------------------------------------------------


async def test_unreachable_sentinels_fail_the_connect_with_the_reason() -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/{SERVICE}"
    bus = Bus(fast_settings([url], operation_timeout=1.0))
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(BusUnavailableError, match="No master found"):
            await bus.connect()
        assert loop.time() - started < 5
    finally:
        await bus.close()


async def test_a_service_no_sentinel_knows_is_a_topology_error(
    sentinel_group: SentinelGroup,
) -> None:
    url = sentinel_group.url.replace(f"/{SERVICE}", "/no-such-service")
    with pytest.raises(TopologyError, match="no Sentinel monitors a master named"):
        await Bus(fast_settings([url])).connect()


async def test_a_plain_redis_named_as_a_sentinel_is_a_topology_error(
    redis_server: RedisServer,
) -> None:
    url = f"redis+sentinel://127.0.0.1:{redis_server.port}/{SERVICE}"
    with pytest.raises(TopologyError, match="is not a Sentinel"):
        await Bus(fast_settings([url])).connect()


# -- durability ---------------------------------------------------------------------------


async def test_replicas_level_waits_for_replicas_and_reports_a_shortfall(
    sentinel_group: SentinelGroup, make_bus: MakeBus
) -> None:
    bus = await make_bus([sentinel_group.url], durability=Durability(replicas=2))
    async with bus.queue("durable") as queue:
        first = await queue.push("both replicas")  # the bus's level: 2 replicas
        with pytest.raises(DurabilityError, match="2 of 3 replica") as caught:
            await queue.push("three", durability="replicas=3", request_id="r-3")
        assert caught.value.ids == (first + 1,)
        # Applied all the same, and a retry with the same request_id is deduped.
        assert await queue.push("three", request_id="r-3") == first + 1
        assert await queue.count() == 2
        for server in sentinel_group.replicas:
            client = server.client()
            try:
                assert await client.xlen("busmq:{durable}:s") == 2
            finally:
                await client.aclose()


async def test_fsync_level_needs_a_server_that_can_confirm_it(
    tmp_path: Path, make_bus: MakeBus
) -> None:
    async with (
        RedisServer(tmp_path / "everysec", extra_args=("--appendfsync", "everysec")) as lazy,
        RedisServer(tmp_path / "always") as strict,  # appendonly yes, appendfsync always
    ):
        bus = await make_bus([lazy.url])
        async with bus.queue("q") as queue:
            with pytest.raises(DurabilityUnsupportedError, match="appendfsync everysec"):
                await queue.push("x", durability=Durability.FSYNC)
            assert await queue.count() == 0  # refused before anything was sent
        bus = await make_bus([strict.url], durability=Durability.FSYNC)
        async with bus.queue("q") as queue:
            assert await queue.push("x") == 1
            assert await queue.push_batch(["y", "z"], durability="async") == [2, 3]


# -- the bus's objects on a Sentinel shard ------------------------------------------------


async def test_queue_channel_service_and_persistable_on_a_sentinel_shard(
    sentinel_group: SentinelGroup, make_bus: MakeBus
) -> None:
    bus = await make_bus([sentinel_group.url])
    await queue_channel_service_and_persistable(bus)


# -- the gateway and federation on a Sentinel shard ---------------------------------------


@pytest.mark.slow
async def test_a_federated_queue_through_a_gateway_on_a_sentinel_shard_survives_failover(
    sentinel_group: SentinelGroup, tmp_path: Path
) -> None:
    async with gateway_and_remote_bus(sentinel_group.url, tmp_path) as (bus_b, target_url):
        remote = bus_b.federate(bus_b.queue("orders"), target_url)
        async with remote:
            got: list[str] = []
            async with remote.consume(Mode.AT_LEAST_ONCE) as consumer:
                for i in range(100):
                    await remote.push(f"before {i}")
                async for delivery in consumer:
                    got.append(delivery.data)
                    await delivery.ack()
                    if len(got) == 100:
                        break
                sentinel_group.master.kill()
                await sentinel_group.wait_failover()
                for i in range(100):  # refused or queued while the master is gone
                    await remote.push(f"after {i}")
                async for delivery in consumer:
                    if delivery.data not in got:
                        got.append(delivery.data)
                    await delivery.ack()
                    if len(got) == 200:
                        break

    assert got == [f"before {i}" for i in range(100)] + [f"after {i}" for i in range(100)]
