"""Secure by default: the gateway process refuses cleartext secrets off loopback and weak
secrets at start, warns once when plaintext is explicitly allowed, and serves TLS
configured from the environment as the container image does (grpcurl with the CA, and
the image's health check)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest

from busmq_gateway import Gateway, GatewaySettings
from tests.conftest import fast_settings
from tests.support.certs import make_pki
from tests.support.gateway_process import gateway_env, spawn_until_ready
from tests.support.redis_server import RedisServer, free_port

STRONG = "a-strong-secret-0123456789"
ROOT = Path(__file__).resolve().parents[2]
GRPCURL = Path(sys.executable).parent / "grpcurl"  # installed into this run's venv


async def run_gateway(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``busmq-gateway`` expecting it to refuse to start: its exit code and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "busmq_gateway", *args,
        env={**gateway_env(), **(env or {})}, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_plaintext_on_every_interface_is_refused_at_start() -> None:
    code, err = await run_gateway("--listen", "0.0.0.0:8443", "--secret", STRONG)
    assert code == 2
    assert "refusing to serve plaintext on 0.0.0.0:8443" in err
    assert "--allow-plaintext" in err and "--tls-cert" in err


async def test_the_container_defaults_without_tls_are_refused() -> None:
    # The Dockerfile's environment (listen on every interface) with a secret, no TLS.
    env = {"BUSMQ_GATEWAY_LISTEN": "0.0.0.0:8443", "BUSMQ_GATEWAY_SECRETS": STRONG}
    code, err = await run_gateway(env=env)
    assert code == 2 and "refusing to serve plaintext" in err


async def test_a_short_secret_is_refused_and_not_echoed() -> None:
    code, err = await run_gateway("--listen", "127.0.0.1:8443", "--secret", "abc")
    assert code == 2
    assert "secret #1 is too weak (shorter than 16 bytes)" in err
    assert "abc" not in err


async def test_a_secret_file_others_can_read_is_refused_with_the_chmod_to_run(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "gateway.secret"
    secret.write_text(STRONG + "\n")
    secret.chmod(0o644)
    code, err = await run_gateway("--listen", "127.0.0.1:8443", "--secret-file", str(secret))
    assert code == 2
    assert "is open to other local users (mode 0644)" in err and f"chmod 600 {secret}" in err
    assert STRONG not in err


async def test_explicit_plaintext_off_loopback_starts_with_one_warning(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = GatewaySettings(
        listen="0.0.0.0:0",
        secrets=(STRONG,),
        allow_plaintext=True,
        bus=fast_settings([redis_server.url]),
    )
    gateway = Gateway(settings)
    with caplog.at_level(logging.WARNING, logger="busmq_gateway"):
        await gateway.start()
        await gateway.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warnings if "PLAINTEXT" in w] == [
        "PLAINTEXT on 0.0.0.0:0 (explicitly allowed): bearer secrets and messages cross the "
        "network unencrypted; acceptable only behind a TLS-terminating proxy or a mesh that "
        "encrypts the hop"
    ]


async def test_loopback_plaintext_starts_without_a_warning(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = GatewaySettings(
        listen="127.0.0.1:0", secrets=(STRONG,), bus=fast_settings([redis_server.url])
    )
    gateway = Gateway(settings)
    with caplog.at_level(logging.WARNING, logger="busmq_gateway"):
        await gateway.start()
        await gateway.stop()
    assert not [r for r in caplog.records if "PLAINTEXT" in r.getMessage()]


async def test_tls_from_the_environment_serves_grpcurl_with_the_ca_and_the_health_check(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    ca, server, _ = make_pki(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    env = {
        **gateway_env(),
        "BUSMQ_GATEWAY_LISTEN": address,
        "BUSMQ_GATEWAY_SECRETS": STRONG,
        "BUSMQ_GATEWAY_TLS_CERT": str(server.cert),  # as mounted into the container
        "BUSMQ_GATEWAY_TLS_KEY": str(server.key),
        "BUSMQ_REDIS_URLS": redis_server.url,
    }
    gateway, _ = await spawn_until_ready(
        sys.executable, "-m", "busmq_gateway", "--log-format", "text", env=env
    )
    try:
        header = f"authorization: Bearer {STRONG}"
        listed = await run(str(GRPCURL), "-cacert", str(ca.cert), "-H", header, address, "list")
        assert listed[0] == 0 and "busmq.v1.QueueService" in listed[1], listed
        plain = await run(str(GRPCURL), "-plaintext", "-H", header, address, "list")
        assert plain[0] != 0  # a TLS port does not speak plaintext
        # The image's HEALTHCHECK: the gateway's TLS settings from the same environment.
        health_env = {**env, "BUSMQ_GATEWAY_TLS_CA": str(ca.cert)}
        health = await run(sys.executable, "-m", "busmq_gateway.healthcheck", env=health_env)
        assert health[0] == 0, health
    finally:
        gateway.terminate()
        await gateway.wait()


async def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode()
