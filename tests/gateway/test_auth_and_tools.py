"""Authentication, health, reflection, and the standard tools (grpcurl, buf curl)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from busmq.v1 import queue_service_pb2 as pb
from tests.gateway.conftest import SECRETS, GatewayUnderTest

BIN = Path(sys.executable).parent


def bearer(secret: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {secret}"),)


@pytest.mark.parametrize(
    ("metadata", "allowed"),
    [
        ((), False),
        (bearer("wrong"), False),
        ((("authorization", SECRETS[0]),), False),  # no Bearer scheme
        (bearer(SECRETS[0]), True),
        (bearer(SECRETS[1]), True),
    ],
    ids=["none", "wrong", "no-scheme", "secret-1", "rotated-secret-2"],
)
async def test_auth_matrix(
    gateway: GatewayUnderTest, metadata: tuple[tuple[str, str], ...], allowed: bool
) -> None:
    request = pb.AttachQueueRequest(queue="guarded")
    if allowed:
        response = await gateway.queues.AttachQueue(request, metadata=metadata)
        assert response.attachment_id
        return
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await gateway.queues.AttachQueue(request, metadata=metadata)
    assert error.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert error.value.details() == "missing or invalid credentials"
    # Streams are guarded too.
    with pytest.raises(grpc.aio.AioRpcError) as stream_error:
        async for _ in gateway.queues.Consume(
            pb.ConsumeRequest(queue="guarded"), metadata=metadata
        ):
            pass
    assert stream_error.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_health_needs_no_secret_and_reports_serving(gateway: GatewayUnderTest) -> None:
    health = health_pb2_grpc.HealthStub(gateway.channel)
    for service in ("", "busmq.v1.QueueService"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def _run(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode()


def _tool(name: str) -> str:
    path = BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} is installed with the dev extras"
    return found


async def test_grpcurl_lists_describes_pushes_and_consumes(gateway: GatewayUnderTest) -> None:
    grpcurl = _tool("grpcurl")
    auth = ["-plaintext", "-H", f"authorization: Bearer {SECRETS[1]}"]
    target = gateway.target
    code, out = await _run(grpcurl, *auth, target, "list")
    assert code == 0, out
    assert "busmq.v1.QueueService" in out and "grpc.health.v1.Health" in out
    code, out = await _run(grpcurl, "-plaintext", target, "list")
    assert code != 0 and "Unauthenticated" in out
    code, out = await _run(grpcurl, *auth, target, "describe", "busmq.v1.QueueService")
    assert code == 0 and "rpc Consume" in out and "stream .busmq.v1.ConsumeResponse" in out
    call = f"{target}"
    code, out = await _run(
        grpcurl, *auth, "-d", '{"queue": "tools"}', call, "busmq.v1.QueueService/AttachQueue"
    )
    assert code == 0, out
    body = json.dumps(
        {"queue": "tools", "messages": [{"payload": "aGk=", "kind": "PAYLOAD_KIND_TEXT"}] * 3}
    )
    code, out = await _run(grpcurl, *auth, "-d", body, call, "busmq.v1.QueueService/Push")
    assert code == 0 and json.loads(out)["ids"] == ["1", "2", "3"], out
    code, out = await _run(
        grpcurl, *auth, "-d", '{"queue": "tools", "max": 3}', call, "busmq.v1.QueueService/Consume"
    )
    assert code == 0, out
    assert out.count('"payload": "aGk="') == 3


async def test_buf_curl_lists_pushes_and_consumes(gateway: GatewayUnderTest) -> None:
    buf = _tool("buf")
    base = f"http://{gateway.target}"
    header = f"authorization: Bearer {SECRETS[0]}"
    # -H goes with the call; reflection requests carry --reflect-header.
    auth = [
        "--protocol",
        "grpc",
        "--http2-prior-knowledge",
        "-H",
        header,
        "--reflect-header",
        header,
    ]
    code, out = await _run(buf, "curl", *auth, "--list-methods", base)
    assert code == 0 and "busmq.v1.QueueService/Push" in out, out
    code, out = await _run(
        buf, "curl", *auth, "-d", '{"queue": "buf"}', f"{base}/busmq.v1.QueueService/AttachQueue"
    )
    assert code == 0, out
    body = json.dumps(
        {"queue": "buf", "messages": [{"payload": "eA==", "kind": "PAYLOAD_KIND_TEXT"}]}
    )
    code, out = await _run(buf, "curl", *auth, "-d", body, f"{base}/busmq.v1.QueueService/Push")
    assert code == 0 and '"1"' in out, out
    code, out = await _run(
        buf,
        "curl",
        *auth,
        "-d",
        '{"queue": "buf", "max": 1}',
        f"{base}/busmq.v1.QueueService/Consume",
    )
    assert code == 0 and '"payload": "eA=="' in out, out
    code, out = await _run(
        buf, "curl", "--protocol", "grpc", "--http2-prior-knowledge", "--list-methods", base
    )
    assert code != 0 and "not authenticated" in out.lower()  # buf words reflection refusal so
