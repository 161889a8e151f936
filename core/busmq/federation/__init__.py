"""Federation: use queues that live in another datacenter through its gRPC gateway.

    from busmq.federation import FederationSettings, FederationTarget

    bus.configure_federation(FederationSettings(targets=[
        FederationTarget("https://gateway-a:8443", secret="...", root_ca_file=ca,
                         fallback_urls=["https://gateway-a2:8443"]),
    ]))
    orders = bus.federate(bus.queue("orders"), "https://gateway-a:8443")
    async with orders:                       # attach through the gateway
        await orders.push({"order": 1})      # an id, or None if queued in the outbox
        async with orders.consume(busmq.Mode.AT_LEAST_ONCE) as consumer:
            async for delivery in consumer:  # resumes across network cuts
                await delivery.ack()

A target is known by its ``url``; ``fallback_urls`` are other instances of the same
gateway. The link uses one URL at a time and, when a probe of it fails (not for refused
credentials), tries the next one round-robin at the usual backoff, moving its channel
pool to the first that answers (a ``failover`` event; streams resume there, the outbox
drains there). It stays there (sticky) rather than return to the primary.

Modules: ``settings`` (targets, outbox bounds, backoff), ``link`` (pool of warm
channels, link state and failover per target), ``queue`` (:class:`FederatedQueue`),
``consume_stream`` (a consumer's resumable ``Consume`` stream: federated consumers are
:class:`busmq.Consumer` over it), ``channel`` (:class:`FederatedChannel`),
``persistable`` (:class:`FederatedPersistable`), ``service`` (:class:`FederatedService`),
``outbox`` (durable SQLite outbox), ``forwarder`` (drains it in order), ``errors`` (gRPC
statuses back to busmq exceptions), ``manager`` (all of it, per bus).
"""

from ..consumer import Consumer as FederatedConsumer  # one consumer, a remote reader
from .channel import FederatedChannel
from .errors import (
    FederationUnauthorizedError,
    InvalidRequestError,
    OutboxFullError,
    RemoteError,
)
from .link import Link, LinkState
from .manager import ChannelStatus, FederationManager, QueueStatus, TargetStatus
from .outbox import DeadLetter, Outbox, OutboxLockedError, OutboxRow
from .persistable import FederatedPersistable
from .queue import ConsumerLag, FederatedQueue
from .service import FederatedService
from .settings import FederationSettings, FederationTarget

__all__ = [
    "ChannelStatus",
    "ConsumerLag",
    "DeadLetter",
    "FederatedChannel",
    "FederatedConsumer",
    "FederatedPersistable",
    "FederatedQueue",
    "FederatedService",
    "FederationManager",
    "FederationSettings",
    "FederationTarget",
    "FederationUnauthorizedError",
    "InvalidRequestError",
    "Link",
    "LinkState",
    "Outbox",
    "OutboxFullError",
    "OutboxLockedError",
    "OutboxRow",
    "QueueStatus",
    "RemoteError",
    "TargetStatus",
]
