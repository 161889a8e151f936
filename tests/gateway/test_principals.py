"""Scoped credentials: principals from a TOML file, their grants enforced on every
method, secrets rotated, an mTLS identity mapped to its principal, and per-principal
limits on streams and pushes."""

from __future__ import annotations

import asyncio
import logging
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2
from busmq_gateway import Gateway, GatewaySettings
from busmq_gateway.config import TlsSettings
from busmq_gateway.principals import ConfigError, Kind, Verb, load
from tests.conftest import fast_settings
from tests.gateway.conftest import error_info
from tests.support.certs import make_pki
from tests.support.redis_server import RedisServer
from tests.support.scrape import scrape

WRITER = "orders-writer-secret-0123456789"
OPS_OLD = "ops-secret-old-0123456789"
OPS_NEW = "ops-secret-new-0123456789"
LIMITED = "limited-secret-0123456789"

CONFIG = """
[[principal]]
name = "orders-writer"
secret_files = ["writer.secret"]
[[principal.allow]]
queues = ["orders.*"]
verbs = ["push"]

[[principal]]
name = "ops"
secret_env = ["OPS_SECRETS"]
metrics = true
[[principal.allow]]
queues = ["*"]
channels = ["*"]
verbs = ["*"]

[[principal]]
name = "limited"
secrets = ["limited-secret-0123456789"]
max_streams = 2
max_pushes_per_second = 100
[[principal.allow]]
queues = ["jobs"]
verbs = ["push", "consume"]
"""


def write_config(directory: Path, text: str = CONFIG) -> Path:
    (directory / "writer.secret").write_text(WRITER + "\n")
    (directory / "writer.secret").chmod(0o600)  # a secret file others can read is refused
    path = directory / "gateway.toml"
    path.write_text(textwrap.dedent(text))
    return path


def auth(secret: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {secret}"),)


def text(value: str) -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=value.encode(), kind=types_pb2.PAYLOAD_KIND_TEXT)


@pytest.fixture
async def scoped(
    redis_server: RedisServer, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, queue_service_pb2_grpc.QueueServiceStub]]:
    principals = load(write_config(tmp_path), {"OPS_SECRETS": f"{OPS_OLD},{OPS_NEW}"})
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        principals=principals,
        bus=fast_settings([redis_server.url]),
        grace_seconds=1,
        http_listen="127.0.0.1:0",
        metrics_cache_seconds=0,
    )
    gateway = Gateway(settings)
    await gateway.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}")
    try:
        yield gateway, queue_service_pb2_grpc.QueueServiceStub(channel)
    finally:
        await channel.close()
        await gateway.stop()


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_a_push_only_principal_cannot_consume_flush_or_touch_other_queues(
    scoped: tuple[Gateway, queue_service_pb2_grpc.QueueServiceStub],
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway, queues = scoped
    writer, ops = auth(WRITER), auth(OPS_NEW)
    await queues.AttachQueue(pb.AttachQueueRequest(queue="orders.eu"), metadata=writer)
    pushed = await queues.Push(pb.PushRequest(queue="orders.eu", messages=[text("a")]),
                               metadata=writer)  # fmt: skip
    assert list(pushed.ids) == [1]
    await queues.AttachQueue(pb.AttachQueueRequest(queue="billing.x"), metadata=ops)

    caplog.set_level(logging.WARNING, logger="busmq_gateway.access")
    consume = pb.ConsumeRequest(queue="orders.eu", max=1)
    denied = await refused(anext(aiter(queues.Consume(consume, metadata=writer))))
    assert denied.code() is grpc.StatusCode.PERMISSION_DENIED
    info = error_info(denied)
    assert info.reason == "PERMISSION_DENIED"
    assert dict(info.metadata) == {"principal": "orders-writer", "kind": "queues",
                                   "verb": "consume", "name": "orders.eu"}  # fmt: skip
    for call in (
        queues.FlushQueue(pb.FlushQueueRequest(queue="orders.eu"), metadata=writer),
        queues.CloseQueue(pb.CloseQueueRequest(queue="orders.eu"), metadata=writer),
        queues.Ack(pb.AckRequest(queue="orders.eu", ids=[1]), metadata=writer),
        queues.Push(pb.PushRequest(queue="billing.x", messages=[text("b")]), metadata=writer),
        queues.AttachQueue(pb.AttachQueueRequest(queue="billing.x"), metadata=writer),
        queues.GetQueue(pb.GetQueueRequest(queue="billing.x"), metadata=writer),
        queues.PushMany(
            pb.PushManyRequest(
                pushes=[
                    pb.PushRequest(queue="orders.eu", messages=[text("c")]),
                    pb.PushRequest(queue="billing.x", messages=[text("d")]),
                ]
            ),
            metadata=writer,
        ),
    ):
        assert (await refused(call)).code() is grpc.StatusCode.PERMISSION_DENIED
    # Nothing of the refused calls happened.
    got = await queues.GetQueue(pb.GetQueueRequest(queue="orders.eu"), metadata=ops)
    assert (got.count, got.last_id) == (1, 1)
    assert (await queues.GetQueue(pb.GetQueueRequest(queue="billing.x"), metadata=ops)).count == 0
    # Listing shows the writer its own queues only; ops sees all.
    mine = await queues.ListQueues(pb.ListQueuesRequest(), metadata=writer)
    assert [q.queue for q in mine.queues] == ["orders.eu"] and mine.total == 1
    every = await queues.ListQueues(pb.ListQueuesRequest(), metadata=ops)
    assert [q.queue for q in every.queues] == ["billing.x", "orders.eu"]

    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "principal orders-writer" in logged
    assert WRITER not in logged and OPS_NEW not in logged
    assert gateway.http is not None
    samples = await scrape(f"http://127.0.0.1:{gateway.http.port}/metrics")
    labels = {"principal": "orders-writer", "reason": "PERMISSION_DENIED"}
    assert samples["busmq_gateway_refused_total", labels] == 8


async def test_rotated_secrets_work_side_by_side_until_removed(
    scoped: tuple[Gateway, queue_service_pb2_grpc.QueueServiceStub],
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    _, queues = scoped
    for secret in (OPS_OLD, OPS_NEW):
        await queues.AttachQueue(pb.AttachQueueRequest(queue="rotating"), metadata=auth(secret))
    wrong = await refused(
        queues.AttachQueue(pb.AttachQueueRequest(queue="rotating"), metadata=auth("x" * 30))
    )
    assert wrong.code() is grpc.StatusCode.UNAUTHENTICATED

    # The old secret removed from the environment: a gateway started now refuses it.
    principals = load(tmp_path / "gateway.toml", {"OPS_SECRETS": OPS_NEW})
    settings = GatewaySettings(
        listen="127.0.0.1:0", principals=principals, bus=fast_settings([redis_server.url])
    )
    gateway = Gateway(settings)
    await gateway.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            stub = queue_service_pb2_grpc.QueueServiceStub(channel)
            request = pb.AttachQueueRequest(queue="rotating")
            await stub.AttachQueue(request, metadata=auth(OPS_NEW))
            old = await refused(stub.AttachQueue(request, metadata=auth(OPS_OLD)))
            assert old.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await gateway.stop()


async def test_the_stream_limit_refuses_one_more_and_frees_a_slot_when_one_ends(
    scoped: tuple[Gateway, queue_service_pb2_grpc.QueueServiceStub],
) -> None:
    gateway, queues = scoped
    limited = auth(LIMITED)
    await queues.AttachQueue(pb.AttachQueueRequest(queue="jobs"), metadata=limited)
    request = pb.ConsumeRequest(queue="jobs", mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE)
    streams = [queues.Consume(request, metadata=limited) for _ in range(2)]
    for stream in streams:
        assert (await anext(aiter(stream))).WhichOneof("event") == "started"
    third = queues.Consume(request, metadata=limited)
    over = await refused(anext(aiter(third)))
    assert over.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(over).reason == "STREAM_LIMIT"
    assert dict(error_info(over).metadata)["max_streams"] == "2"
    # Another principal is not held back by it.
    other = queues.Consume(request, metadata=auth(OPS_NEW))
    assert (await anext(aiter(other))).WhichOneof("event") == "started"
    other.cancel()

    streams[0].cancel()
    for _ in range(100):
        if gateway.access.streams_of("limited") == 1:
            break
        await asyncio.sleep(0.02)  # polling: the cancel reaches the gateway's task
    assert gateway.access.streams_of("limited") == 1
    fourth = queues.Consume(request, metadata=limited)
    assert (await anext(aiter(fourth))).WhichOneof("event") == "started"
    for stream in (streams[1], fourth):
        stream.cancel()


async def test_the_push_rate_limit_refuses_with_a_retry_hint(
    scoped: tuple[Gateway, queue_service_pb2_grpc.QueueServiceStub],
) -> None:
    _, queues = scoped
    limited = auth(LIMITED)
    await queues.AttachQueue(pb.AttachQueueRequest(queue="jobs"), metadata=limited)
    batch = pb.PushRequest(queue="jobs", messages=[text(str(n)) for n in range(100)])
    await queues.Push(batch, metadata=limited)  # a second's worth at once
    over = await refused(queues.Push(batch, metadata=limited))
    assert over.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(over)
    assert info.reason == "PUSH_RATE_LIMIT"
    retry_after = int(info.metadata["retry_after_ms"]) / 1000
    assert 0 < retry_after <= 1.01
    await asyncio.sleep(retry_after)  # the hint the gateway gave
    await queues.Push(batch, metadata=limited)
    # Refused pushes stored nothing; other principals are not limited.
    await queues.Push(batch, metadata=auth(OPS_NEW))
    got = await queues.GetQueue(pb.GetQueueRequest(queue="jobs"), metadata=auth(OPS_NEW))
    assert got.count == 300


async def test_an_mtls_identity_maps_to_its_principal(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    ca, server, client = make_pki(tmp_path)
    config = write_config(tmp_path, """
        [[principal]]
        name = "dc-b"
        client_certificate = "busmq test client"
        [[principal.allow]]
        queues = ["replicated.*"]
        verbs = ["push", "consume", "ack"]
    """)  # fmt: skip
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        principals=load(config),
        tls=TlsSettings(server.cert, server.key, ca.cert),
        bus=fast_settings([redis_server.url]),
    )
    gateway = Gateway(settings)
    await gateway.start()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.cert.read_bytes(),
        private_key=client.key.read_bytes(),
        certificate_chain=client.cert.read_bytes(),
    )
    try:
        async with grpc.aio.secure_channel(f"127.0.0.1:{gateway.port}", credentials) as channel:
            stub = queue_service_pb2_grpc.QueueServiceStub(channel)
            await stub.AttachQueue(pb.AttachQueueRequest(queue="replicated.a"))  # no secret
            await stub.Push(pb.PushRequest(queue="replicated.a", messages=[text("x")]))
            denied = await refused(stub.FlushQueue(pb.FlushQueueRequest(queue="replicated.a")))
            assert denied.code() is grpc.StatusCode.PERMISSION_DENIED
            assert error_info(denied).metadata["principal"] == "dc-b"
    finally:
        await gateway.stop()


def test_the_config_file_is_checked_with_clear_errors(tmp_path: Path) -> None:
    principals = load(write_config(tmp_path), {"OPS_SECRETS": f"{OPS_OLD},{OPS_NEW}"})
    writer, ops, limited = principals
    assert writer.secrets == (WRITER,) and ops.secrets == (OPS_OLD, OPS_NEW)
    assert writer.may(Kind.QUEUE, Verb.PUSH, "orders.eu")
    assert not writer.may(Kind.QUEUE, Verb.PUSH, "orders")  # "orders.*" needs the dot
    assert not writer.may(Kind.CHANNEL, Verb.PUSH, "orders.eu")
    assert (limited.max_streams, limited.max_pushes_per_second) == (2, 100.0)
    assert WRITER not in repr(writer)

    def refused_config(body: str, env: dict[str, str] | None = None) -> str:
        path = tmp_path / "bad.toml"
        path.write_text(textwrap.dedent(body))
        with pytest.raises(ConfigError) as caught:
            load(path, env or {})
        return str(caught.value)

    assert "unknown key(s) ['verb']" in refused_config("""
        [[principal]]
        name = "a"
        secrets = ["a-secret-0123456789"]
        [[principal.allow]]
        queues = ["*"]
        verb = ["push"]
    """)  # fmt: skip
    assert "verbs are" in refused_config("""
        [[principal]]
        name = "a"
        secrets = ["a-secret-0123456789"]
        [[principal.allow]]
        queues = ["*"]
        verbs = ["write"]
    """)  # fmt: skip
    assert "too weak" in refused_config('[[principal]]\nname = "a"\nsecrets = ["short"]\n')
    assert "OPS is not set" in refused_config('[[principal]]\nname = "a"\nsecret_env = ["OPS"]\n')
    assert "give secrets" in refused_config('[[principal]]\nname = "a"\n')
    assert "share a credential" in refused_config("""
        [[principal]]
        name = "a"
        secrets = ["same-secret-0123456789"]
        [[principal]]
        name = "b"
        secrets = ["same-secret-0123456789"]
    """)  # fmt: skip
    assert "secret file" in refused_config(
        '[[principal]]\nname = "a"\nsecret_files = ["missing"]\n'
    )
    (tmp_path / "open.secret").write_text("open-secret-0123456789\n")
    (tmp_path / "open.secret").chmod(0o640)
    refused = refused_config('[[principal]]\nname = "a"\nsecret_files = ["open.secret"]\n')
    assert "principal 'a'" in refused and "(mode 0640)" in refused and "chmod 600" in refused
    certificate_only = '[[principal]]\nname = "dc-b"\nclient_certificate = "dc-b.example"\n'
    principals = load(write_config(tmp_path, certificate_only))
    with pytest.raises(ValueError, match="need mTLS"):
        GatewaySettings(listen="127.0.0.1:0", principals=principals)


def test_every_method_has_an_access_rule() -> None:
    from google.protobuf import descriptor_pool

    from busmq_gateway.access import RULES

    pool = descriptor_pool.Default()
    methods = {
        f"/{service}/{method.name}"
        for service in (
            "busmq.v1.QueueService",
            "busmq.v1.ChannelService",
            "busmq.v1.PersistableService",
            "busmq.v1.RequestService",
        )
        for method in pool.FindServiceByName(service).methods
    }
    assert methods == set(RULES)


async def test_grants_apply_to_channels_persistables_and_services(
    scoped: tuple[Gateway, queue_service_pb2_grpc.QueueServiceStub],
) -> None:
    from busmq.v1 import (
        channel_service_pb2,
        channel_service_pb2_grpc,
        persistable_service_pb2,
        persistable_service_pb2_grpc,
        request_service_pb2,
        request_service_pb2_grpc,
    )

    gateway, _ = scoped
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
        channels = channel_service_pb2_grpc.ChannelServiceStub(channel)
        persistables = persistable_service_pb2_grpc.PersistableServiceStub(channel)
        requests = request_service_pb2_grpc.RequestServiceStub(channel)
        writer = auth(WRITER)
        connect = channel_service_pb2.ConnectChannelRequest(
            channel="orders.chat", local_role="a", remote_role="b"
        )
        for call in (
            anext(aiter(channels.ConnectChannel(connect, metadata=writer))),
            persistables.LoadPersistable(
                persistable_service_pb2.LoadPersistableRequest(name="orders.cart"), metadata=writer
            ),
            requests.Call(request_service_pb2.CallRequest(service="orders.price"), metadata=writer),
        ):
            denied = await refused(call)
            assert denied.code() is grpc.StatusCode.PERMISSION_DENIED
        # ops holds channels but no persistables or services.
        ops = auth(OPS_NEW)
        stream = channels.ConnectChannel(connect, metadata=ops)
        assert (await anext(aiter(stream))).WhichOneof("event") == "started"
        stream.cancel()
        load = persistable_service_pb2.LoadPersistableRequest(name="orders.cart")
        denied = await refused(persistables.LoadPersistable(load, metadata=ops))
        assert error_info(denied).metadata["kind"] == "persistables"


async def test_the_example_config_serves_from_a_gateway_process(redis_server: RedisServer) -> None:
    from tests.support.gateway_process import ROOT_CONFIG, GatewayProcess

    secrets = {
        "BUSMQ_OPS_SECRETS": f"{OPS_NEW},{OPS_OLD}",
        "BUSMQ_SHOP_SECRET": "shop-secret-0123456789",
        "BUSMQ_FULFILMENT_SECRET": "fulfilment-secret-0123456789",
    }
    gateway = GatewayProcess(redis_server.url, (), "--config", str(ROOT_CONFIG), env=secrets)
    await gateway.start()
    try:
        async with grpc.aio.insecure_channel(gateway.target) as channel:
            stub = queue_service_pb2_grpc.QueueServiceStub(channel)
            shop = auth("shop-secret-0123456789")
            await stub.AttachQueue(pb.AttachQueueRequest(queue="orders.web"), metadata=shop)
            await stub.Push(pb.PushRequest(queue="orders.web", messages=[text("o")]), metadata=shop)
            consume = pb.ConsumeRequest(queue="orders.web", max=1)
            denied = await refused(anext(aiter(stub.Consume(consume, metadata=shop))))
            assert denied.code() is grpc.StatusCode.PERMISSION_DENIED
            worker = auth("fulfilment-secret-0123456789")
            [started, delivery] = [r async for r in stub.Consume(consume, metadata=worker)]
            assert started.WhichOneof("event") == "started"
            assert delivery.delivery.message.payload == b"o"
            for secret in (OPS_OLD, OPS_NEW):
                await stub.GetQueue(pb.GetQueueRequest(queue="orders.web"), metadata=auth(secret))
    finally:
        await gateway.stop()
