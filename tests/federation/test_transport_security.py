"""The federation client refuses cleartext secrets off loopback unless told otherwise, and
verifies a TLS gateway's certificate (a private CA through ``root_ca_file``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from busmq import Bus, Event
from busmq.federation import FederatedQueue, FederationSettings, FederationTarget, LinkState
from tests.conftest import fast_settings
from tests.federation.conftest import FAST_LINK, SECRET
from tests.support.certs import make_pki
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.7:8443", "http://gateway-a.example:8443", "http://[2001:db8::1]:8443"],
)
def test_plaintext_to_a_host_off_loopback_is_refused_without_an_opt_in(url: str) -> None:
    with pytest.raises(ValueError, match=r"refusing plaintext.*allow_plaintext=True"):
        FederationTarget(url, secret=SECRET)
    with pytest.raises(ValueError, match="refusing plaintext"):  # a fallback counts too
        FederationTarget("http://127.0.0.1:8443", secret=SECRET, fallback_urls=(url,))
    assert FederationTarget(url, secret=SECRET, allow_plaintext=True).plaintext_off_loopback


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8443", "http://localhost:8443", "http://[::1]:8443", "https://a:1"]
)
def test_loopback_plaintext_and_tls_need_no_opt_in(url: str) -> None:
    assert not FederationTarget(url, secret=SECRET).plaintext_off_loopback


async def test_an_allowed_plaintext_link_off_loopback_is_logged_as_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = FederationTarget("http://10.0.0.7:8443", secret=SECRET, allow_plaintext=True)
    async with RedisServer(tmp_path / "redis") as redis, Bus(fast_settings([redis.url])) as bus:
        with caplog.at_level(logging.WARNING, logger="busmq.federation"):
            bus.configure_federation(
                FederationSettings(targets=[target], outbox_path=tmp_path / "outbox.sqlite3")
            )
    warnings = [r.getMessage() for r in caplog.records if "PLAINTEXT" in r.getMessage()]
    assert warnings == [
        "PLAINTEXT on the link to http://10.0.0.7:8443 (explicitly allowed): bearer secrets "
        "and messages cross the network unencrypted; acceptable only behind a "
        "TLS-terminating proxy or a mesh that encrypts the hop"
    ]


async def test_a_gateway_certificate_from_another_ca_is_refused(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    ca, server, _ = make_pki(tmp_path)
    (tmp_path / "other").mkdir()
    other = make_pki(tmp_path / "other")[0].cert
    gateway = GatewayProcess(
        redis_server.url, (SECRET,), "--tls-cert", str(server.cert), "--tls-key", str(server.key)
    )
    await gateway.start()
    url = f"https://127.0.0.1:{gateway.port}"
    settings = fast_settings([redis_server.url])
    try:
        async with Bus(settings) as bus:  # trusts another CA: the handshake fails
            target = FederationTarget(url, secret=SECRET, root_ca_file=other)
            remote = federate(bus, target, tmp_path / "outbox-1.sqlite3")
            errors: list[Event] = []
            remote.link.events.on(lambda e: errors.append(e) if e.kind == "error" else None)
            await eventually(lambda: bool(errors), what="the first probe's outcome")
            assert remote.link.state is LinkState.DISCONNECTED
            assert await remote.push("kept for later") is None  # into the outbox
        async with Bus(settings) as bus:  # trusts the gateway's CA
            target = FederationTarget(url, secret=SECRET, root_ca_file=ca.cert)
            remote = federate(bus, target, tmp_path / "outbox-2.sqlite3")
            assert await remote.link.wait_usable(10)
            async with remote:  # attached through the verified connection
                assert await remote.push("verified") == 1
    finally:
        await gateway.stop()


def federate(bus: Bus, target: FederationTarget, outbox: Path) -> FederatedQueue:
    bus.configure_federation(FederationSettings(targets=[target], outbox_path=outbox, **FAST_LINK))
    return bus.federate("secure", target.url)
