"""Gateway configuration: refusing unsafe setups, secrets from every source."""

from __future__ import annotations

from pathlib import Path

import pytest

from busmq_gateway.__main__ import parse_args, settings_from
from busmq_gateway.config import GatewaySettings, TlsSettings, read_secrets

STRONG = "a-strong-secret-0123456789"
TLS = TlsSettings(Path("server.crt"), Path("server.key"))


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
    secret_file.chmod(0o600)
    found = read_secrets(["flag"], [str(secret_file)], {"BUSMQ_GATEWAY_SECRETS": "env-1, env-2"})
    assert found == ("flag", "from-file", "another", "env-1", "env-2")


def test_settings_repr_hides_secrets() -> None:
    settings = GatewaySettings(listen="127.0.0.1:0", secrets=(STRONG,))
    assert STRONG not in repr(settings)


@pytest.mark.parametrize(
    ("listen", "tls", "allow_plaintext", "outcome"),
    [
        ("127.0.0.1:8443", None, False, "plaintext"),
        ("[::1]:8443", None, False, "plaintext"),
        ("localhost:8443", None, False, "plaintext"),
        ("127.0.0.1:8443", TLS, False, "tls"),
        ("127.0.0.1:8443", None, True, "plaintext"),
        ("0.0.0.0:8443", None, False, "refused"),
        ("[::]:8443", None, False, "refused"),
        ("gateway.example.com:8443", None, False, "refused"),
        ("0.0.0.0:8443", TLS, False, "tls"),
        ("0.0.0.0:8443", None, True, "plaintext, warned"),
        ("0.0.0.0:8443", TLS, True, "tls"),
    ],
)
def test_plaintext_off_loopback_needs_an_explicit_opt_in(
    listen: str, tls: TlsSettings | None, allow_plaintext: bool, outcome: str
) -> None:
    def build() -> GatewaySettings:
        return GatewaySettings(
            listen=listen, secrets=(STRONG,), tls=tls, allow_plaintext=allow_plaintext
        )

    if outcome == "refused":
        with pytest.raises(ValueError, match=r"refusing to serve plaintext.*--allow-plaintext"):
            build()
        return
    settings = build()
    assert (settings.tls is not None) == (outcome == "tls")
    assert settings.plaintext_off_loopback == (outcome == "plaintext, warned")


@pytest.mark.parametrize(
    ("secret", "reason"),
    [
        ("abc", "shorter than 16 bytes"),
        ("change-me", "shorter than 16 bytes"),
        ("fifteen-bytes!!", "shorter than 16 bytes"),
        ("aaaaaaaaaaaaaaaaaaaaaaaa", "fewer than 8 distinct characters"),
        ("abcabcabcabcabcabcabc", "fewer than 8 distinct characters"),
    ],
)
def test_weak_secrets_are_refused_without_being_echoed(secret: str, reason: str) -> None:
    with pytest.raises(ValueError, match=f"secret #2 is too weak \\({reason}\\)") as error:
        GatewaySettings(listen="127.0.0.1:0", secrets=(STRONG, secret))
    assert secret not in str(error.value)
    assert "secrets.token_urlsafe" in str(error.value)  # how to make a good one


def test_cli_builds_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BUSMQ_GATEWAY_SECRETS", raising=False)
    args = parse_args(
        ["--listen", "127.0.0.1:9000", "--secret", STRONG, "--redis-url", "redis://127.0.0.1:7000"]
    )
    settings = settings_from(args)
    assert settings.listen == "127.0.0.1:9000"
    assert settings.secrets == (STRONG,)
    assert not settings.allow_plaintext
    assert settings.bus.redis_urls == ("redis://127.0.0.1:7000",)
    with pytest.raises(ValueError, match="both"):
        settings_from(parse_args(["--secret", STRONG, "--tls-cert", "x.pem"]))


def test_allow_plaintext_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BUSMQ_GATEWAY_SECRETS", STRONG)
    monkeypatch.setenv("BUSMQ_GATEWAY_LISTEN", "0.0.0.0:8443")
    monkeypatch.delenv("BUSMQ_GATEWAY_ALLOW_PLAINTEXT", raising=False)
    with pytest.raises(ValueError, match=r"refusing to serve plaintext on 0\.0\.0\.0:8443"):
        settings_from(parse_args([]))
    assert settings_from(parse_args(["--allow-plaintext"])).allow_plaintext
    monkeypatch.setenv("BUSMQ_GATEWAY_ALLOW_PLAINTEXT", "true")
    assert settings_from(parse_args([])).plaintext_off_loopback
