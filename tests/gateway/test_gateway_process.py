"""The gateway as a real process: SIGTERM drain, restart, slow readers, health."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import grpc
import psutil
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually

AUTH = (("authorization", "Bearer gateway-secret-0123456789"),)
ALO = types_pb2.CONSUME_MODE_AT_LEAST_ONCE


@pytest.fixture
async def gateway_process(redis_server: RedisServer) -> AsyncIterator[GatewayProcess]:
    # An outage longer than failover_timeout (3 s) fails calls with UNAVAILABLE.
    process = GatewayProcess(redis_server.url, env={"BUSMQ_FAILOVER_TIMEOUT": "3"})
    await process.start()
    try:
        yield process
    finally:
        await process.stop()


def stub(target: str) -> tuple[grpc.aio.Channel, queue_service_pb2_grpc.QueueServiceStub]:
    channel = grpc.aio.insecure_channel(target)
    return channel, queue_service_pb2_grpc.QueueServiceStub(channel)


async def push_texts(queues: queue_service_pb2_grpc.QueueServiceStub, queue: str, n: int) -> None:
    messages = [types_pb2.OutgoingMessage(payload=str(i).encode()) for i in range(n)]
    await queues.Push(pb.PushRequest(queue=queue, messages=messages), metadata=AUTH)


async def test_sigterm_drains_streams_and_unacked_messages_are_redelivered_after_restart(
    gateway_process: GatewayProcess,
) -> None:
    channel, queues = stub(gateway_process.target)
    await queues.AttachQueue(
        pb.AttachQueueRequest(queue="jobs", ttl=duration_pb2.Duration(seconds=120)), metadata=AUTH
    )
    await push_texts(queues, "jobs", 50)
    long = duration_pb2.Duration(seconds=600)
    acked: set[int] = set()
    received: list[int] = []
    ended = []

    async def read_stream() -> None:
        call = queues.Consume(
            pb.ConsumeRequest(queue="jobs", mode=ALO, prefetch=10, visibility_timeout=long),
            metadata=AUTH,
        )
        async for response in call:
            if response.HasField("delivery"):
                message_id = response.delivery.message.id
                received.append(message_id)
                if message_id % 2 == 0:  # ack half of what arrives
                    try:
                        await queues.Ack(
                            pb.AckRequest(queue="jobs", ids=[message_id]), metadata=AUTH
                        )
                    except grpc.aio.AioRpcError:
                        continue  # the gateway stopped in between: stays unacked
                    acked.add(message_id)
            elif response.HasField("state"):
                ended.append(response.state.kind)
        ended.append(f"status:{(await call.code()).name}")

    readers = [asyncio.create_task(read_stream()) for _ in range(2)]
    await eventually(lambda: len(received) >= 20, what="deliveries before SIGTERM")
    gateway_process.signal(signal.SIGTERM)
    assert await gateway_process.wait() == 0
    await asyncio.gather(*readers)
    # Both streams ended cleanly: a "draining" event, then status OK.
    assert sorted(ended) == ["draining", "draining", "status:OK", "status:OK"]
    await channel.close()

    await gateway_process.start()
    channel, queues = stub(gateway_process.target)
    # Everything not acked comes back at once, not after the 600 s visibility timeout.
    expected = set(range(1, 51)) - acked
    again: set[int] = set()
    call = queues.Consume(
        pb.ConsumeRequest(queue="jobs", mode=ALO, visibility_timeout=long), metadata=AUTH
    )
    async for response in call:
        if response.HasField("delivery"):
            again.add(response.delivery.message.id)
            if again >= expected:
                break
    call.cancel()
    assert again == expected
    await channel.close()


async def test_a_slow_reader_keeps_gateway_memory_bounded_and_others_flowing(
    gateway_process: GatewayProcess,
) -> None:
    channel, queues = stub(gateway_process.target)
    for name in ("firehose", "side"):
        await queues.AttachQueue(pb.AttachQueueRequest(queue=name), metadata=AUTH)
    payload = b"x" * 512
    batch = [types_pb2.OutgoingMessage(payload=payload)] * 1000
    slow = queues.Consume(pb.ConsumeRequest(queue="firehose", prefetch=100), metadata=AUTH)
    slow_stream = slow.__aiter__()
    assert (await slow_stream.__anext__()).HasField("started")
    process = psutil.Process(gateway_process.process.pid)  # type: ignore[union-attr]
    rss_before = process.memory_info().rss
    for _ in range(100):  # 100,000 messages, 51 MB of payload
        await queues.Push(pb.PushRequest(queue="firehose", messages=batch), metadata=AUTH)
    side_seen = 0
    side = queues.Consume(pb.ConsumeRequest(queue="side"), metadata=AUTH)
    side_stream = side.__aiter__()
    assert (await side_stream.__anext__()).HasField("started")
    for round_ in range(10):
        await slow_stream.__anext__()  # one message per 100 ms
        await queues.Push(
            pb.PushRequest(
                queue="side", messages=[types_pb2.OutgoingMessage(payload=b"%d" % round_)]
            ),
            metadata=AUTH,
        )
        response = await asyncio.wait_for(side_stream.__anext__(), 5)
        while not response.HasField("delivery"):
            response = await asyncio.wait_for(side_stream.__anext__(), 5)
        side_seen += 1
        await asyncio.sleep(0.1)  # the pace of the side stream's reads
    rss_after = process.memory_info().rss
    slow.cancel()
    side.cancel()
    # Read-ahead is bounded by the consumer's prefetch plus the HTTP/2 flow-control
    # windows (a few MB), not the 100,000 messages waiting in Redis.
    info = await queues.GetQueue(pb.GetQueueRequest(queue="firehose"), metadata=AUTH)
    print(f"read ahead of the slow reader: {100_000 - info.count} messages")
    assert info.count > 100_000 - 20_000
    assert side_seen == 10
    grown_mb = (rss_after - rss_before) / 2**20
    print(f"gateway RSS grew {grown_mb:.1f} MiB while 100,000 x 512 B waited for a slow reader")
    assert grown_mb < 40
    await channel.close()


async def test_health_is_not_serving_while_redis_is_down(
    redis_server: RedisServer, gateway_process: GatewayProcess
) -> None:
    channel = grpc.aio.insecure_channel(gateway_process.target)
    health = health_pb2_grpc.HealthStub(channel)

    async def status() -> int:
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
        return int(reply.status)

    assert await status() == health_pb2.HealthCheckResponse.SERVING
    redis_server.kill()
    await redis_server.wait_exit()

    async def not_serving() -> bool:
        return await status() == health_pb2.HealthCheckResponse.NOT_SERVING

    await eventually(not_serving, timeout=15, what="NOT_SERVING")
    _, queues = stub(gateway_process.target)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await queues.GetQueue(pb.GetQueueRequest(queue="any"), metadata=AUTH, timeout=20)
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    await redis_server.start()

    async def serving() -> bool:
        return await status() == health_pb2.HealthCheckResponse.SERVING

    await eventually(serving, timeout=15, what="SERVING again")
    await channel.close()
