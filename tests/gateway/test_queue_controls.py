"""Processing controls through the gateway: delayed pushes, nack with a delay, reject,
max deliveries, dead letters and their requeue, pause and rate limits in GetQueue."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf import duration_pb2

from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import types_pb2
from tests.gateway.conftest import AUTH, GatewayUnderTest
from tests.gateway.test_queue_service import attach, error_reason, text
from tests.support.redis_server import RedisServer

ALO = types_pb2.CONSUME_MODE_AT_LEAST_ONCE


def ms(value: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=value // 1000, nanos=(value % 1000) * 1_000_000)


class Stream:
    """An at-least-once Consume stream: its consumer id and deliveries one by one."""

    def __init__(self, gw: GatewayUnderTest, request: pb.ConsumeRequest) -> None:
        self.call = gw.queues.Consume(request, metadata=AUTH)
        self._responses = self.call.__aiter__()
        self.consumer_id = ""

    async def start(self) -> Stream:
        first = await self._responses.__anext__()
        self.consumer_id = first.started.consumer_id
        return self

    async def next(self) -> types_pb2.Delivery:
        while True:
            response = await self._responses.__anext__()
            if response.HasField("delivery"):
                return response.delivery


async def test_delayed_push_nack_delay_reject_and_requeue(gateway: GatewayUnderTest) -> None:
    queues = gateway.queues
    await attach(gateway, "gw-controls")
    pushed = time.monotonic()
    delayed = await queues.Push(
        pb.PushRequest(queue="gw-controls", messages=[text("later")], delay=ms(400)),
        metadata=AUTH,
    )
    await queues.Push(pb.PushRequest(queue="gw-controls", messages=[text("now")]), metadata=AUTH)
    info = await queues.GetQueue(pb.GetQueueRequest(queue="gw-controls"), metadata=AUTH)
    assert (info.count, info.delayed) == (1, 1)

    stream = await Stream(gateway, pb.ConsumeRequest(queue="gw-controls", mode=ALO)).start()
    now = await stream.next()
    assert now.message.payload == b"now"
    later = await stream.next()
    assert later.message.id == delayed.ids[0] and time.monotonic() - pushed >= 0.39

    # Nack with a delay: back after it, with its count; the error is kept for its letter.
    nacked = time.monotonic()
    response = await queues.Nack(
        pb.NackRequest(
            queue="gw-controls",
            consumer_id=stream.consumer_id,
            ids=[now.message.id, 999],
            delay=ms(300),
            error="downstream 503",
        ),
        metadata=AUTH,
    )
    assert list(response.unknown_ids) == [999]
    again = await stream.next()
    assert (again.message.id, again.delivery_count) == (now.message.id, 2)
    assert time.monotonic() - nacked >= 0.29

    rejected = await queues.Reject(
        pb.RejectRequest(
            queue="gw-controls",
            consumer_id=stream.consumer_id,
            ids=[again.message.id, later.message.id],
            reason="bad payload",
        ),
        metadata=AUTH,
    )
    assert list(rejected.unknown_ids) == []
    stream.call.cancel()
    info = await queues.GetQueue(pb.GetQueueRequest(queue="gw-controls"), metadata=AUTH)
    assert (info.count, info.pending, info.dead_letters) == (0, 0, 2)

    # The dead-letter queue is a normal queue: replay it, then requeue one letter.
    await attach(gateway, "gw-controls:dead")
    replay = gateway.queues.Consume(
        pb.ConsumeRequest(queue="gw-controls:dead", mode=types_pb2.CONSUME_MODE_REPLAY, max=2),
        metadata=AUTH,
    )
    letters = [r.delivery async for r in replay if r.HasField("delivery")]
    headers = dict(letters[0].message.headers)
    assert headers["busmq-dead-reason"] == "rejected"
    assert headers["busmq-dead-error"] == "bad payload"
    assert headers["busmq-dead-id"] == str(now.message.id)
    assert headers["busmq-dead-deliveries"] == "2"
    requeued = await queues.RequeueDead(
        pb.RequeueDeadRequest(queue="gw-controls", ids=[letters[1].message.id]), metadata=AUTH
    )
    assert list(requeued.ids) == [3]
    info = await queues.GetQueue(pb.GetQueueRequest(queue="gw-controls"), metadata=AUTH)
    assert (info.count, info.dead_letters) == (1, 1)


async def test_max_deliveries_and_retry_policy_of_a_stream(gateway: GatewayUnderTest) -> None:
    queues = gateway.queues
    await attach(gateway, "gw-poison")
    await queues.Push(pb.PushRequest(queue="gw-poison", messages=[text("x")]), metadata=AUTH)
    request = pb.ConsumeRequest(
        queue="gw-poison",
        mode=ALO,
        max_deliveries=2,
        retry_policy=pb.RetryPolicy(initial=ms(100), factor=2),
    )
    stream = await Stream(gateway, request).start()
    for count in (1, 2):
        delivery = await stream.next()
        assert delivery.delivery_count == count
        await queues.Nack(
            pb.NackRequest(
                queue="gw-poison", consumer_id=stream.consumer_id, ids=[delivery.message.id]
            ),
            metadata=AUTH,
        )
    stream.call.cancel()
    info = await queues.GetQueue(pb.GetQueueRequest(queue="gw-poison"), metadata=AUTH)
    assert (info.count, info.delayed, info.dead_letters) == (0, 0, 1)


async def test_controls_are_set_and_shown(gateway: GatewayUnderTest) -> None:
    queues = gateway.queues
    await attach(gateway, "gw-paced")
    await queues.UpdateQueueControls(
        pb.UpdateQueueControlsRequest(
            queue="gw-paced",
            paused=True,
            rate_limit=pb.RateLimit(limit=50, per=ms(1000)),
            max_deliveries=5,
            drop_expired=True,
        ),
        metadata=AUTH,
    )
    await queues.UpdateQueueControls(
        pb.UpdateQueueControlsRequest(
            queue="gw-paced", rate_limit=pb.RateLimit(limit=3, per=ms(500), key="tenant")
        ),
        metadata=AUTH,
    )
    info = await queues.GetQueue(pb.GetQueueRequest(queue="gw-paced"), metadata=AUTH)
    assert info.paused and info.max_deliveries == 5 and info.drop_expired
    assert (info.rate_limit.limit, info.rate_limit.per.seconds) == (50, 1)
    assert (info.key_rate_limit.limit, info.key_rate_limit.key) == (3, "tenant")
    assert info.key_rate_limit.per.nanos == 500_000_000

    await queues.UpdateQueueControls(
        pb.UpdateQueueControlsRequest(
            queue="gw-paced", paused=False, remove_rate_limits=True, max_deliveries=0
        ),
        metadata=AUTH,
    )
    info = await queues.GetQueue(pb.GetQueueRequest(queue="gw-paced"), metadata=AUTH)
    assert not info.paused and info.max_deliveries == 0
    assert not info.HasField("rate_limit") and not info.HasField("key_rate_limit")


@pytest.mark.parametrize(
    "request_fields",
    [
        {"delay": ms(100), "deliver_at": {"seconds": 1}},
        {"ttl": duration_pb2.Duration(seconds=-1)},
        {"delay": duration_pb2.Duration(seconds=10**9)},
    ],
    ids=["delay-and-deliver-at", "negative-ttl", "delay-beyond-a-year"],
)
async def test_bad_timing_is_invalid_argument(
    gateway: GatewayUnderTest, request_fields: dict[str, object]
) -> None:
    await attach(gateway, "gw-timing")
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await gateway.queues.Push(
            pb.PushRequest(queue="gw-timing", messages=[text("x")], **request_fields),  # type: ignore[arg-type]
            metadata=AUTH,
        )
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(failure.value) == "INVALID_ARGUMENT"


async def test_a_bad_rate_limit_is_invalid_argument(gateway: GatewayUnderTest) -> None:
    await attach(gateway, "gw-bad-rate")
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await gateway.queues.UpdateQueueControls(
            pb.UpdateQueueControlsRequest(queue="gw-bad-rate", rate_limit=pb.RateLimit(limit=0)),
            metadata=AUTH,
        )
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_nack_and_reject_reach_a_stream_served_by_another_gateway_process(
    gateway: GatewayUnderTest, redis_server: RedisServer
) -> None:
    """Two gateways on one Redis stand for two workers: the stream is on one, the
    settlements land on the other; the consumer lives in Redis's group."""
    from busmq.v1 import queue_service_pb2_grpc
    from busmq_gateway import Gateway, GatewaySettings
    from tests.conftest import fast_settings
    from tests.gateway.conftest import SECRETS

    other = Gateway(GatewaySettings(listen="127.0.0.1:0", secrets=SECRETS,
                                    bus=fast_settings([redis_server.url])))  # fmt: skip
    await other.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{other.port}") as channel:
            elsewhere = queue_service_pb2_grpc.QueueServiceStub(channel)
            queues = gateway.queues
            await queues.AttachQueue(pb.AttachQueueRequest(queue="split"), metadata=AUTH)
            messages = [types_pb2.OutgoingMessage(payload=b"%d" % n) for n in range(3)]
            await queues.Push(pb.PushRequest(queue="split", messages=messages), metadata=AUTH)
            request = pb.ConsumeRequest(queue="split", mode=ALO)
            stream = await Stream(gateway, request).start()
            consumer_id = stream.consumer_id
            first = [(await stream.next()).message.id for _ in range(3)]
            assert first == [1, 2, 3]

            nack = pb.NackRequest(queue="split", consumer_id=consumer_id, ids=[1])
            nack.delay.FromMilliseconds(200)
            assert not (await elsewhere.Nack(nack, metadata=AUTH)).unknown_ids
            reject = pb.RejectRequest(queue="split", consumer_id=consumer_id, ids=[2], reason="no")
            assert not (await elsewhere.Reject(reject, metadata=AUTH)).unknown_ids
            again = await stream.next()
            assert (again.message.id, again.delivery_count) == (1, 2)  # retried, after 200 ms
            info = await queues.GetQueue(pb.GetQueueRequest(queue="split"), metadata=AUTH)
            assert info.dead_letters == 1

            unknown = pb.NackRequest(queue="split", consumer_id="no-such-consumer", ids=[3])
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await elsewhere.Nack(unknown, metadata=AUTH)
            assert refused.value.code() is grpc.StatusCode.NOT_FOUND
            stream.call.cancel()
    finally:
        await other.stop()
