"""Gateway configuration: refusing unsafe setups, secrets from every source."""

from __future__ import annotations

from pathlib import Path

import pytest

from busmq_gateway.__main__ import parse_args, settings_from
from busmq_gateway.config import GatewaySettings, read_secrets


def test_refuses_to_start_without_a_secret() -> None:
    with pytest.raises(ValueError, match="no secret configured"):
        GatewaySettings(listen="127.0.0.1:8443")


def test_no_auth_is_only_allowed_on_loopback() -> None:
    assert GatewaySettings(listen="127.0.0.1:0", allow_no_auth=True).secrets == ()
    assert GatewaySettings(listen="[::1]:0", allow_no_auth=True).secrets == ()
    with pytest.raises(ValueError, match="loopback"):
        GatewaySettings(listen="0.0.0.0:8443", allow_no_auth=True)


def test_secrets_come_from_flags_files_and_environment(tmp_path: Path) -> None:
    secret_file = tmp_path / "secrets"
    secret_file.write_text("from-file\n\nanother\n")
    found = read_secrets(["flag"], [str(secret_file)], {"BUSMQ_GATEWAY_SECRETS": "env-1, env-2"})
    assert found == ("flag", "from-file", "another", "env-1", "env-2")


def test_settings_repr_hides_secrets() -> None:
    settings = GatewaySettings(listen="127.0.0.1:0", secrets=("hunter2",))
    assert "hunter2" not in repr(settings)


def test_cli_builds_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BUSMQ_GATEWAY_SECRETS", raising=False)
    args = parse_args(
        ["--listen", "127.0.0.1:9000", "--secret", "a", "--redis-url", "redis://127.0.0.1:7000"]
    )
    settings = settings_from(args)
    assert settings.listen == "127.0.0.1:9000"
    assert settings.secrets == ("a",)
    assert settings.bus.redis_urls == ("redis://127.0.0.1:7000",)
    with pytest.raises(ValueError, match="both"):
        settings_from(parse_args(["--secret", "a", "--tls-cert", "x.pem"]))
