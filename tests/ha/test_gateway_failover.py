"""A gateway's ``Consume`` stream across a Sentinel failover: a client with the generated
Python stubs keeps one at-least-once stream open, acks what it gets, and pushes with
request ids, while the master is SIGKILLed. The stream rides through (the gateway's
consumer waits for the new master) and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import pytest

from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2
from tests.support.gateway_process import GatewayProcess
from tests.support.sentinel import SentinelGroup
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
    pytest.mark.usefixtures("collect_sentinel_leaks"),
]

SECRET = "ha-gateway-secret-0123456789"
AUTH = (("authorization", f"Bearer {SECRET}"),)
TOTAL = 2_000


async def test_a_consume_stream_rides_through_a_sentinel_failover(
    sentinel_group: SentinelGroup,
) -> None:
    gateway = GatewayProcess(sentinel_group.url, (SECRET,), env={"BUSMQ_DURABILITY": "replicas=1"})
    await gateway.start()
    channel = grpc.aio.insecure_channel(gateway.target)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    acknowledged: dict[int, int] = {}  # n -> id its push returned
    delivered: dict[int, set[int]] = defaultdict(set)
    push_errors: list[str] = []
    stream_ends: list[str] = []
    try:
        await queues.AttachQueue(pb.AttachQueueRequest(queue="orders"), metadata=AUTH)

        async def produce() -> None:
            for n in range(TOTAL):
                message = [types_pb2.OutgoingMessage(payload=str(n).encode())]
                request = pb.PushRequest(queue="orders", messages=message, request_id=f"o-{n}")
                while True:
                    try:
                        reply = await queues.Push(request, metadata=AUTH, timeout=60)
                        acknowledged[n] = reply.ids[0]
                        break
                    except grpc.aio.AioRpcError as exc:  # may be stored: same request id
                        push_errors.append(exc.code().name)
                        await asyncio.sleep(0.05)
                await asyncio.sleep(0.002)  # the pace of the producer

        async def consume() -> None:
            # One stream, opened again only if the gateway ends it.
            while True:
                request = pb.ConsumeRequest(
                    queue="orders", mode=types_pb2.CONSUME_MODE_AT_LEAST_ONCE
                )
                call = queues.Consume(request, metadata=AUTH)
                try:
                    async for response in call:
                        if response.HasField("delivery"):
                            message = response.delivery.message
                            delivered[int(message.payload)].add(message.id)
                            await queues.Ack(
                                pb.AckRequest(queue="orders", ids=[message.id]),
                                metadata=AUTH,
                                timeout=60,
                            )
                except grpc.aio.AioRpcError as exc:
                    stream_ends.append(exc.code().name)
                    await asyncio.sleep(0.1)  # back off before reopening the stream

        consumer = asyncio.create_task(consume())
        producer = asyncio.create_task(produce())
        try:
            await eventually(lambda: len(acknowledged) >= TOTAL // 3, timeout=60)
            await sentinel_group.kill_master()
            await asyncio.wait_for(producer, 120)

            await every_acknowledged_consumed(acknowledged, delivered, queues, gateway)
            assert not consumer.done(), consumer
        finally:
            for task in (producer, consumer):
                task.cancel()
            await asyncio.gather(producer, consumer, return_exceptions=True)
    finally:
        await channel.close()
        await gateway.stop()
    assert len(acknowledged) == TOTAL
    assert stream_ends == [], f"the stream ended: {stream_ends}"
    print(
        f"\ngateway stream across a failover: {TOTAL} acknowledged, all consumed; "
        f"{len(push_errors)} push errors retried ({sorted(set(push_errors))})"
    )


async def every_acknowledged_consumed(
    acknowledged: dict[int, int],
    delivered: dict[int, set[int]],
    queues: queue_service_pb2_grpc.QueueServiceStub,
    gateway: GatewayProcess,
) -> None:
    """Wait until every acknowledged push was consumed; else fail with what is missing, the
    queue's counts and the gateway's last log lines."""

    def missing() -> dict[int, int]:
        return {n: i for n, i in acknowledged.items() if i not in delivered.get(n, ())}

    try:
        await eventually(lambda: not missing(), timeout=60)
    except AssertionError as timeout:
        info = await queues.GetQueue(pb.GetQueueRequest(queue="orders"), metadata=AUTH)
        first = sorted(missing().items())[:20]
        log = "\n".join(gateway.recent)
        raise AssertionError(
            f"{len(missing())} acknowledged pushes never consumed, the first (n, id): "
            f"{first}; delivered other ids for them: "
            f"{[(n, delivered.get(n)) for n, _ in first]}; the queue: {info}; "
            f"the gateway's last lines:\n{log}"
        ) from timeout
