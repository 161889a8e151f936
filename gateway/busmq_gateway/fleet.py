"""What makes gateways interchangeable: the ids they hand out are signed, not remembered.

An id that a later call names (an attachment, a consumer, a channel connection, a served
request) carries what that call needs: the principal it was handed to, the object, and,
for what lives in one gateway's memory (a stream), the gateway that holds it. It is
signed with the fleet key (HMAC-SHA256), which every gateway over the same Redis shares,
so any gateway checks it without a lookup; a call that needs the stream is relayed to
its holder (:mod:`busmq_gateway.relay`).

The fleet key is ``--fleet-secret-file`` / ``BUSMQ_GATEWAY_FLEET_SECRET`` when given,
else a random key that the first gateway stores in Redis (``SET NX``) and every other
one reads: a fleet over one Redis needs no configuration for it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Any, NamedTuple

from busmq import Bus

from .errors import NotFound

FLEET_KEY = "busmq:gateway:fleet-key"
_SEPARATOR = "\x1f"  # not in names, roles, principal names or the ids we make
_MAC_BYTES = 16


class IdKind(NamedTuple):
    """A kind of id: its tag in the signed fields, and how a bad one is refused."""

    tag: str
    reason: str
    message: str

    def not_found(self) -> NotFound:
        return NotFound(self.message, self.reason)


ATTACHMENT = IdKind("a", "ATTACHMENT_NOT_FOUND", "unknown or expired attachment")
CONSUMER = IdKind("c", "CONSUMER_NOT_FOUND", "no active stream with that consumer_id")
CONNECTION = IdKind("n", "CONNECTION_NOT_FOUND", "no connected channel end with that connection_id")
REQUEST = IdKind("r", "REQUEST_NOT_FOUND", "no request awaits a reply with that request_id")


class FleetKey:
    """Signs ids with the fleet key and opens them again, on any gateway of the fleet.
    The key is set by :meth:`load` when the gateway starts."""

    def __init__(self, key: bytes = b"") -> None:
        self._key = key

    async def load(self, bus: Bus, secret: str | None) -> None:
        """Take the configured ``secret``'s key, else the one the fleet shares in Redis."""
        self._key = await _fleet_key(bus, secret)

    def sign(self, kind: IdKind, *fields: str) -> str:
        payload = _SEPARATOR.join((kind.tag, *fields)).encode()
        return f"{_b64(payload)}.{_b64(self._mac(payload))}"

    def open(self, kind: IdKind, token: str) -> list[str]:
        """The fields signed into ``token``; ``NOT_FOUND`` (the kind's reason) for an id
        this fleet did not issue, or one of another kind."""
        try:
            body, mac = token.split(".")
            payload = _unb64(body)
            genuine = hmac.compare_digest(self._mac(payload), _unb64(mac))
            fields = payload.decode().split(_SEPARATOR)
        except (ValueError, binascii.Error, UnicodeDecodeError):
            genuine, fields = False, []
        if not genuine or fields[0] != kind.tag:
            raise kind.not_found()
        return fields[1:]

    def _mac(self, payload: bytes) -> bytes:
        if not self._key:
            raise RuntimeError("the fleet key is not loaded (the gateway is not started)")
        return hmac.digest(self._key, payload, hashlib.sha256)[:_MAC_BYTES]


async def _fleet_key(bus: Bus, secret: str | None) -> bytes:
    if secret:
        return hashlib.sha256(secret.encode()).digest()
    shard = await bus.placement.locate("gateway:fleet-key", FLEET_KEY)
    fresh = secrets.token_hex(32)

    async def shared(client: Any) -> str:
        await client.set(FLEET_KEY, fresh, nx=True)
        found: bytes | str = await client.get(FLEET_KEY)
        return found.decode() if isinstance(found, bytes) else found

    key = await shard.run(shared, idempotent=True)
    bus.placement.remember(FLEET_KEY, shard)
    return bytes.fromhex(key)


def new_gateway_id() -> str:
    """This gateway process's id in the fleet (the route of what it holds)."""
    return secrets.token_hex(6)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
