"""The calls a client retries by itself, on another gateway, when one fails ``UNAVAILABLE``.

Behind a balancer, a gateway that dies or drains fails the calls in flight on it
(``UNAVAILABLE``: a reset stream, a 502 from the balancer). The calls below are safe to
repeat — renewing, settling, reading, releasing — so the channel retries them itself
with gRPC's retry policy (exponential backoff with gRPC's own jitter), and each attempt
is a new call the balancer may send to another gateway. A stream is retried only
before its first message (nothing was delivered yet). Calls that are not safe to repeat
(an attach, a push without a request id, a reply) are left to the caller, which knows.
Federated pushes have their own path: a request id, producer sequences and the outbox.

The same policy is in the TypeScript and Go clients (``RETRY_SERVICE_CONFIG`` there).
"""

from __future__ import annotations

import json
from typing import Any

SAFE_TO_RETRY: dict[str, tuple[str, ...]] = {
    "busmq.v1.QueueService": (
        "RenewAttachment",
        "DetachQueue",
        "Consume",
        "Ack",
        "Nack",
        "Reject",
        # Not GetQueue: it is the link's probe, which must fail fast (the link has its
        # own backoff and moves to a fallback URL); its other uses are reads a caller
        # repeats as it likes.
        "ListQueues",
        "BrowseQueue",
    ),
    "busmq.v1.ChannelService": ("ConnectChannel", "AckChannel"),
    "busmq.v1.PersistableService": ("LoadPersistable", "RenewPersistable"),
    "busmq.v1.RequestService": ("Serve",),
}

RETRY_POLICY: dict[str, Any] = {
    "maxAttempts": 5,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    # CANCELLED by the other side (ours is never retried): a balancer resets a call
    # when the gateway behind it goes away.
    "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
}


def service_config() -> dict[str, Any]:
    """The gRPC service config with :data:`RETRY_POLICY` for :data:`SAFE_TO_RETRY`."""
    names = [
        {"service": service, "method": method}
        for service, methods in SAFE_TO_RETRY.items()
        for method in methods
    ]
    return {"methodConfig": [{"name": names, "retryPolicy": RETRY_POLICY}]}


def channel_options() -> list[tuple[str, Any]]:
    """grpc channel options that turn the retries on."""
    return [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(service_config()))]
