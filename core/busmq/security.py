"""Transport-security rules shared by the gateway and the federation client.

A bearer secret sent without TLS can be read by anyone on the path, so plaintext is
accepted without a word only where traffic never leaves the machine (loopback); any
other plaintext setup must be asked for explicitly (``--allow-plaintext``,
``FederationTarget(allow_plaintext=True)``), e.g. behind a TLS-terminating proxy or a
service mesh, and is logged as a warning. A secret must be long and varied enough that
guessing it is not an option.
"""

from __future__ import annotations

import ipaddress

MIN_SECRET_BYTES = 16
MIN_SECRET_DISTINCT_CHARACTERS = 8
GENERATE_SECRET = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an IP address, IPv6 with or without brackets) is the
    local machine's loopback interface."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback(address: str) -> bool:
    """Whether a ``host:port`` address is on the loopback interface."""
    return is_loopback_host(address.rsplit(":", 1)[0])


def weak_secret_reason(secret: str) -> str | None:
    """Why ``secret`` is too weak to accept (``None``: strong enough). Never repeats the
    secret itself."""
    if len(secret.encode()) < MIN_SECRET_BYTES:
        return f"shorter than {MIN_SECRET_BYTES} bytes"
    if len(set(secret)) < MIN_SECRET_DISTINCT_CHARACTERS:
        return f"fewer than {MIN_SECRET_DISTINCT_CHARACTERS} distinct characters"
    return None


def plaintext_warning(where: str) -> str:
    return (
        f"PLAINTEXT on {where} (explicitly allowed): bearer secrets and messages cross the "
        "network unencrypted; acceptable only behind a TLS-terminating proxy or a mesh "
        "that encrypts the hop"
    )
