"""Exit 0 if the local gateway reports SERVING (for container health checks).

``python -m busmq_gateway.healthcheck [host:port]``; the default target is the port of
``BUSMQ_GATEWAY_LISTEN`` on 127.0.0.1. Uses TLS when ``BUSMQ_GATEWAY_TLS_CERT`` is set,
trusting ``BUSMQ_GATEWAY_TLS_CA`` (default: that certificate itself, which fits a
self-signed one) for the name ``localhost``. A gateway that requires client
certificates (mTLS) is better checked from outside.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(target: str, root_file: str | None) -> bool:
    if root_file:
        with open(root_file, "rb") as roots:
            credentials = grpc.ssl_channel_credentials(root_certificates=roots.read())
        options = [("grpc.ssl_target_name_override", "localhost")]
        channel = grpc.secure_channel(target, credentials, options)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=2
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def main() -> None:
    listen = os.environ.get("BUSMQ_GATEWAY_LISTEN", "127.0.0.1:8443")
    target = sys.argv[1] if len(sys.argv) > 1 else f"127.0.0.1:{listen.rsplit(':', 1)[1]}"
    env = os.environ
    roots = env.get("BUSMQ_GATEWAY_TLS_CA") or env.get("BUSMQ_GATEWAY_TLS_CERT")
    sys.exit(0 if check(target, roots) else 1)


if __name__ == "__main__":
    main()
