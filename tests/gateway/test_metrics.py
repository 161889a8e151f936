"""The gateway's HTTP listener: /metrics after a known sequence of calls, /healthz, and the
label bound on queues."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest

from busmq import Mode
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2
from busmq_gateway import Gateway, GatewaySettings
from tests.conftest import fast_settings
from tests.gateway.conftest import AUTH, SECRETS
from tests.support.gateway_process import running_gateway
from tests.support.redis_server import RedisServer
from tests.support.scrape import Samples, scrape

AT_LEAST_ONCE = types_pb2.CONSUME_MODE_AT_LEAST_ONCE


@pytest.fixture
async def gateway(redis_server: RedisServer) -> AsyncIterator[Gateway]:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        secrets=SECRETS,
        bus=fast_settings([redis_server.url]),
        grace_seconds=2,
        http_listen="127.0.0.1:0",
        metrics_max_queues=3,
        metrics_cache_seconds=0.0,
    )
    async with running_gateway(settings) as gateway:
        yield gateway


def base_url(gateway: Gateway) -> str:
    assert gateway.http is not None
    return f"http://127.0.0.1:{gateway.http.port}"


def stub(channel: grpc.aio.Channel) -> queue_service_pb2_grpc.QueueServiceStub:
    return queue_service_pb2_grpc.QueueServiceStub(channel)


async def consume_and_die(
    target: str, queue: str, count: int, ack: int, visibility: float = 30.0
) -> list[int]:
    """A client on a channel of its own takes ``count`` deliveries at least once (its
    stream ends there, at ``max``), acks the first ``ack`` of them, then dies: its
    connection closes with the rest unacked."""
    channel = grpc.aio.insecure_channel(target)
    queues = stub(channel)
    request = pb.ConsumeRequest(queue=queue, mode=AT_LEAST_ONCE, max=count, batch=True)
    request.visibility_timeout.FromNanoseconds(int(visibility * 1e9))
    call = queues.Consume(request, metadata=AUTH)
    ids: list[int] = []
    async for response in call:  # to its end: the gateway ends it at max, status OK
        if response.WhichOneof("event") == "batch":
            ids += [d.message.id for d in response.batch.deliveries]
    if ack:
        acked = await queues.Ack(pb.AckRequest(queue=queue, ids=ids[:ack]), metadata=AUTH)
        assert acked.acked == ack
    await channel.close(grace=None)  # the client is gone, mid-stream
    return ids


async def until_no_streams(gateway: Gateway) -> None:
    """The gateway noticed the dead client and closed its consumer."""
    for _ in range(100):
        if gateway.active_streams == 0:
            return
        await asyncio.sleep(0.05)  # polling: the gateway sees the client gone
    raise AssertionError(f"{gateway.active_streams} streams still open")


async def test_metrics_after_push_consume_ack_and_a_dead_consumer(gateway: Gateway) -> None:
    target = f"127.0.0.1:{gateway.port}"
    async with grpc.aio.insecure_channel(target) as channel:
        queues = stub(channel)
        await queues.AttachQueue(pb.AttachQueueRequest(queue="orders"), metadata=AUTH)
        for _ in range(10):
            messages = [types_pb2.OutgoingMessage(payload=b"%d" % i) for i in range(10)]
            await queues.Push(pb.PushRequest(queue="orders", messages=messages), metadata=AUTH)
        ids = await consume_and_die(target, "orders", 60, 50)
        assert ids == list(range(1, 61))
        # The gateway sees the stream end, closes its consumer and gives back what it
        # handed out (the client's acks came after and still count): the unacked ten
        # wait, due at once, for the next read of any consumer.
        await until_no_streams(gateway)

        samples = await scrape(base_url(gateway) + "/metrics")
        orders = {"queue": "orders"}
        assert samples["busmq_queue_pushed_total", orders] == 100
        assert samples["busmq_queue_messages", orders] == 50  # acked entries are removed
        assert samples["busmq_queue_depth", orders] == 40
        assert samples["busmq_queue_pending", orders] == 0
        assert samples["busmq_queue_delayed", orders] == 10
        assert samples["busmq_queue_delivered_total", orders] == 60
        assert samples["busmq_queue_oldest_pending_seconds", orders] == 0
        assert samples["busmq_queue_dead_letters", orders] == 0
        assert samples["busmq_queue_attachments", orders] == 1
        assert samples["busmq_client_pushed_total", orders] == 100
        assert samples["busmq_client_delivered_total", orders] == 60
        assert samples["busmq_client_redelivered_total", orders] == 0
        assert samples["busmq_client_acked_total", orders] == 50
        assert samples["busmq_queues", {}] == 1
        assert samples["busmq_gateway_active_streams", {}] == 0
        push = {"grpc_service": "busmq.v1.QueueService", "grpc_method": "Push"}
        unary = {"grpc_type": "unary", **push}
        assert samples["grpc_server_started_total", unary] == 10
        assert samples["grpc_server_handled_total", {**unary, "grpc_code": "OK"}] == 10
        assert samples["grpc_server_handling_seconds_count", {**unary, "grpc_code": "OK"}] == 10
        consume = {
            "grpc_type": "server_stream",
            "grpc_service": "busmq.v1.QueueService",
            "grpc_method": "Consume",
        }
        assert samples["grpc_server_started_total", consume] == 1
        assert [labels["grpc_code"] for labels in samples.labels_of("grpc_server_handled_total")
                if labels["grpc_method"] == "Consume"] == ["OK"]  # ended at max=60  # fmt: skip
        [shard] = samples.labels_of("busmq_shard_up")
        assert samples["busmq_shard_up", shard] == 1
        assert samples["busmq_shard_ping_seconds", shard] > 0

        # A second consumer takes the other 40 and, once their visibility timeout has
        # passed, the dead one's ten again: redeliveries.
        again = await consume_and_die(target, "orders", 50, 50, visibility=0.3)
        assert sorted(again) == list(range(51, 101))
        await until_no_streams(gateway)
        samples = await scrape(base_url(gateway) + "/metrics")
        assert samples["busmq_queue_messages", orders] == 0
        assert samples["busmq_queue_depth", orders] == 0
        assert samples["busmq_queue_pending", orders] == 0
        assert samples["busmq_queue_oldest_pending_seconds", orders] == 0
        assert samples["busmq_queue_delivered_total", orders] == 100  # first reads
        assert samples["busmq_client_delivered_total", orders] == 110
        assert samples["busmq_client_redelivered_total", orders] == 10
        assert samples["busmq_client_acked_total", orders] == 100

        # A refused call is counted under its status code.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await queues.Push(pb.PushRequest(queue="", messages=[]), metadata=AUTH)
        code = refused.value.code().name
        samples = await scrape(base_url(gateway) + "/metrics")
        assert samples["grpc_server_handled_total", {**unary, "grpc_code": code}] == 1


async def test_queue_labels_are_bounded_and_the_rest_summed(gateway: Gateway) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
        queues = stub(channel)
        for n in range(6):
            name = f"q{n}"
            await queues.AttachQueue(pb.AttachQueueRequest(queue=name), metadata=AUTH)
            messages = [types_pb2.OutgoingMessage(payload=b"x")] * (n + 1)
            await queues.Push(pb.PushRequest(queue=name, messages=messages), metadata=AUTH)
    samples = await scrape(base_url(gateway) + "/metrics")
    labels = sorted(q["queue"] for q in samples.labels_of("busmq_queue_depth"))
    assert labels == ["_other", "q0", "q1", "q2"]  # metrics_max_queues=3
    assert samples["busmq_queue_depth", {"queue": "_other"}] == 4 + 5 + 6
    assert samples["busmq_queues", {}] == 6
    assert samples["busmq_client_pushed_total", {"queue": "_other"}] == 4 + 5 + 6


async def test_healthz_and_the_dashboard_page_are_served(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url(gateway) + "/healthz") as response:
            assert (response.status, await response.text()) == (200, "ok\n")
        async with session.get(base_url(gateway) + "/") as response:
            assert response.status == 200
            assert "<title>busmq gateway</title>" in await response.text()
        async with session.get(base_url(gateway) + "/api/overview") as response:
            overview = await response.json()
            assert overview["queues"] == [] and overview["federation"] == []
            assert [s["online"] for s in overview["shards"]] == [True]


def test_samples_parse_the_exposition_format() -> None:
    samples = Samples('# TYPE x_total counter\nx_total{queue="a"} 3.0\n')
    assert samples["x_total", {"queue": "a"}] == 3


async def test_dead_letters_now_and_ever(gateway: Gateway) -> None:
    queue = gateway.bus.queue("jobs")
    await queue.attach(ttl=60)
    await queue.push_batch(["a", "b", "c"])
    async with queue.consume(Mode.AT_LEAST_ONCE, max=3) as consumer:
        async for delivery in consumer:
            if delivery.data == "c":
                await delivery.ack()
            else:
                await delivery.reject("bad")
    [requeued] = await queue.requeue_dead(limit=1)
    samples = await scrape(base_url(gateway) + "/metrics")
    jobs = {"queue": "jobs"}
    assert samples["busmq_queue_dead_letters", jobs] == 1  # one left, one requeued
    assert samples["busmq_queue_dead_lettered_total", jobs] == 2  # ever
    assert samples["busmq_client_rejected_total", jobs] == 2
    assert samples["busmq_queue_depth", jobs] == 1 and requeued == 4
