"""The channel protocol shared by local and federated channel ends, and by the gateway:
roles and the queue names they map to, the end states, the control header and the
reserved header prefix, and sending to a role without an end in hand."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from .errors import InvalidNameError
from .keys import validate_name
from .message import Delivery, EncodedMessage, check_headers
from .pushing import PushResult
from .queue import Queue

if TYPE_CHECKING:
    from .context import BusContext

CONTROL_HEADER = "busmq-control"
"""Header that marks a control message; its value is ``connect``, ``disconnect`` or ``end``."""
QUEUE_INFIX = ":to:"
MAX_ROLE_LENGTH = 40
_ROLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@/-]*")

Handler = Callable[[Delivery], Awaitable[object]]


class ChannelState(enum.Enum):
    """Where one end stands: ``idle`` (never connected), ``connected``,
    ``disconnected`` (may connect again) or ``ended`` (final)."""

    IDLE = "idle"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    ENDED = "ended"


def validate_role(role: str) -> str:
    """Return ``role`` if it is a valid channel role, else raise :class:`InvalidNameError`.

    A role is 1-40 ASCII letters, digits and ``_ . @ / -`` (no ``:``, which separates
    the parts of the queue names), starting with a letter or digit.
    """
    if not isinstance(role, str) or not _ROLE.fullmatch(role) or len(role) > MAX_ROLE_LENGTH:
        raise InvalidNameError(
            str(role),
            f"a role is 1-{MAX_ROLE_LENGTH} ASCII letters, digits and _ . @ / - "
            "(starting with a letter or digit)",
        )
    return role


def channel_queue_name(channel: str, role: str) -> str:
    """The queue that the end playing ``role`` of ``channel`` consumes."""
    return f"{channel}{QUEUE_INFIX}{role}"


async def send_encoded_to_role(
    bus: BusContext,
    channel: str,
    role: str,
    messages: Sequence[EncodedMessage],
    *,
    request_id: str | None = None,
    ttl: float | None = None,
) -> PushResult:
    """Push encoded messages to the queue of ``role`` of ``channel`` without an end of the
    channel in hand (what :meth:`Channel.send_to` does for one message). The queue is
    created if needed, so the messages wait for an end of that role (until ``ttl`` runs
    out with no end attached)."""
    validate_name(channel)
    validate_role(role)
    check_encoded_headers(messages)
    queue = Queue(bus, channel_queue_name(channel, role))
    await queue.attach(ttl=ttl)
    try:
        return await queue.push_encoded(messages, request_id=request_id)
    finally:
        await queue.detach()


def check_encoded_headers(messages: Sequence[EncodedMessage]) -> None:
    for message in messages:
        if message.headers:
            check_headers(json.loads(message.headers))
