"""Who may call the gateway, and what each may do: principals with their credentials,
grants and limits, read from a TOML file (``busmq-gateway --config FILE``).

    [[principal]]
    name = "orders-service"                     # in logs, metrics and denials
    secret_files = ["/run/secrets/orders"]      # one secret per line; several for rotation
    secret_env = ["ORDERS_SECRET"]              # or from the environment
    client_certificate = "orders.dc-b.example"  # and/or an mTLS identity (CN or a SAN)
    max_streams = 20                            # concurrent server streams (0: no limit)
    max_pushes_per_second = 5000                # messages pushed or sent (0: no limit)
    max_queues = 100                            # queues its attachments hold at once
    max_backlog = 100000                        # the highest max_backlog it may set
    metrics = false                             # may read /metrics and the dashboard

    [[principal.allow]]
    queues = ["orders.*"]                       # fnmatch patterns of names
    verbs = ["push"]                            # push, consume, ack, admin ("*": all)

The simple form of the gateway (``--secret``) is one principal, ``default``, allowed
everything. What each verb covers per object kind is in :mod:`busmq_gateway.access`.
"""

from __future__ import annotations

import enum
import fnmatch
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from busmq.private import ExposedSecretError, read_secret_file
from busmq.security import weak_secret_reason


class Kind(enum.Enum):
    QUEUE = "queues"
    CHANNEL = "channels"
    PERSISTABLE = "persistables"
    SERVICE = "services"


class Verb(enum.Enum):
    PUSH = "push"
    CONSUME = "consume"
    ACK = "ack"
    ADMIN = "admin"


ALL_VERBS = frozenset(Verb)


class ConfigError(ValueError):
    """The principals file is wrong; the message names the principal and the field."""


@dataclass(frozen=True)
class Grant:
    """``verbs`` on the objects of ``kind`` whose names match one of ``patterns``."""

    kind: Kind
    patterns: tuple[str, ...]
    verbs: frozenset[Verb]
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        joined = "|".join(f"(?:{fnmatch.translate(p)})" for p in self.patterns) or "(?!)"
        object.__setattr__(self, "_regex", re.compile(joined))

    def allows(self, kind: Kind, verb: Verb | None, name: str) -> bool:
        """Whether this grant covers ``verb`` (any verb when ``None``) on ``name``."""
        if kind is not self.kind or (verb is not None and verb not in self.verbs):
            return False
        return self._regex.fullmatch(name) is not None


@dataclass(frozen=True)
class Principal:
    """A caller: its name, how it proves who it is, what it may do, its limits."""

    name: str
    secrets: tuple[str, ...] = ()
    client_certificate: str | None = None
    grants: tuple[Grant, ...] = ()
    max_streams: int = 0
    max_pushes_per_second: float = 0
    max_queues: int = 0
    """Queues its attachments may hold alive at once, per gateway process (0: no limit)."""
    max_backlog: int = 0
    """The highest backlog limit it may give a queue; it attaches none without one."""
    metrics: bool = False

    def may(self, kind: Kind, verb: Verb | None, name: str) -> bool:
        return any(grant.allows(kind, verb, name) for grant in self.grants)

    def __repr__(self) -> str:
        return (
            f"Principal(name={self.name!r}, secrets=<{len(self.secrets)} hidden>, "
            f"client_certificate={self.client_certificate!r}, grants={self.grants!r})"
        )


def everything(name: str, secrets: Iterable[str]) -> Principal:
    """The simple form: one principal allowed every verb on every object."""
    grants = tuple(Grant(kind, ("*",), ALL_VERBS) for kind in Kind)
    return Principal(name, tuple(secrets), grants=grants, metrics=True)


def load(path: Path, environ: Mapping[str, str] | None = None) -> tuple[Principal, ...]:
    """The principals of a TOML file (see the module docstring)."""
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    unknown = set(document) - {"principal"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {sorted(unknown)}; expected [[principal]]")
    entries = document.get("principal", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: no [[principal]] entries")
    env = os.environ if environ is None else environ
    principals = tuple(_principal(entry, path.parent, env) for entry in entries)
    _check_unique(principals)
    return principals


_PRINCIPAL_KEYS = {
    "name", "secrets", "secret_files", "secret_env", "client_certificate", "allow",
    "max_streams", "max_pushes_per_second", "max_queues", "max_backlog", "metrics",
}  # fmt: skip


def _principal(entry: Any, base: Path, env: Mapping[str, str]) -> Principal:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise ConfigError("every [[principal]] needs a name")
    name = entry["name"]
    where = f"principal {name!r}"
    unknown = set(entry) - _PRINCIPAL_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    secrets = [*_strings(entry, "secrets", where)]
    for file in _strings(entry, "secret_files", where):
        file_path = base / file
        try:
            text = read_secret_file(file_path)
        except ExposedSecretError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{where}: secret file {file_path}: {exc.strerror}") from None
        secrets += [line.strip() for line in text.splitlines() if line.strip()]
    for variable in _strings(entry, "secret_env", where):
        if not env.get(variable):
            raise ConfigError(f"{where}: environment variable {variable} is not set")
        secrets += [s.strip() for s in env[variable].split(",") if s.strip()]
    for secret in secrets:
        reason = weak_secret_reason(secret)
        if reason:
            raise ConfigError(f"{where}: a secret is too weak: {reason}")
    certificate = entry.get("client_certificate")
    if certificate is not None and (not isinstance(certificate, str) or not certificate):
        raise ConfigError(f"{where}: client_certificate must be a non-empty string")
    if not secrets and certificate is None:
        raise ConfigError(f"{where}: give secrets, secret_files, secret_env or client_certificate")
    return Principal(
        name=name,
        secrets=tuple(secrets),
        client_certificate=certificate,
        grants=tuple(_grants(entry.get("allow", []), where)),
        max_streams=_number(entry, "max_streams", where, int),
        max_pushes_per_second=_number(entry, "max_pushes_per_second", where, float),
        max_queues=_number(entry, "max_queues", where, int),
        max_backlog=_number(entry, "max_backlog", where, int),
        metrics=_flag(entry, "metrics", where),
    )


def _grants(allow: Any, where: str) -> Iterable[Grant]:
    if not isinstance(allow, list):
        raise ConfigError(f"{where}: allow must be a list of tables ([[principal.allow]])")
    for rule in allow:
        if not isinstance(rule, dict):
            raise ConfigError(f"{where}: each allow entry is a table")
        unknown = set(rule) - {"verbs", *(k.value for k in Kind)}
        if unknown:
            raise ConfigError(f"{where}: allow: unknown key(s) {sorted(unknown)}")
        names = _strings(rule, "verbs", where) or ["*"]
        try:
            verbs = ALL_VERBS if "*" in names else frozenset(Verb(v) for v in names)
        except ValueError:
            valid = ", ".join(v.value for v in Verb)
            raise ConfigError(f"{where}: verbs are {valid} or *; got {names}") from None
        kinds = [kind for kind in Kind if kind.value in rule]
        if not kinds:
            raise ConfigError(f"{where}: an allow entry names no queues, channels, ...")
        for kind in kinds:
            yield Grant(kind, tuple(_strings(rule, kind.value, where)), verbs)


def _strings(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {key} must be a list of non-empty strings")
    return list(value)


def _number(table: Mapping[str, Any], key: str, where: str, kind: type[float]) -> Any:
    value = table.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{where}: {key} must be a number >= 0")
    return kind(value)


def _flag(table: Mapping[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false")
    return value


def _check_unique(principals: tuple[Principal, ...]) -> None:
    names: set[str] = set()
    owners: dict[str, str] = {}  # secret or certificate identity -> principal
    for principal in principals:
        if principal.name in names:
            raise ConfigError(f"two principals are named {principal.name!r}")
        names.add(principal.name)
        credentials = [*principal.secrets]
        if principal.client_certificate is not None:
            credentials.append("\0cert:" + principal.client_certificate)
        for credential in credentials:
            if credential in owners:
                raise ConfigError(
                    f"principals {owners[credential]!r} and {principal.name!r} share a credential"
                )
            owners[credential] = principal.name
