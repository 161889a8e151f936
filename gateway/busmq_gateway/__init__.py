"""busmq gateway: the bus over gRPC (HTTP/2), with server-streaming delivery.

Run it with ``busmq-gateway`` (or ``python -m busmq_gateway``); embed it with
:func:`busmq_gateway.server.serve` / :class:`busmq_gateway.server.Gateway`.
"""

from .config import GatewaySettings
from .server import Gateway

__all__ = ["Gateway", "GatewaySettings"]
