"""How many streams one gateway process holds: thousands started at once all start (a
burst, as when every client reconnects after a deploy), and past the gateway's
``max_streams`` a stream is refused RESOURCE_EXHAUSTED with the limit, never cancelled
silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import duration_pb2

from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import queue_service_pb2_grpc, types_pb2
from busmq_gateway import Gateway, GatewaySettings
from tests.conftest import fast_settings
from tests.gateway.conftest import error_info
from tests.support.gateway_process import GatewayProcess, running_gateway
from tests.support.heavy import cpu_heavy
from tests.support.redis_server import RedisServer

SECRET = "gateway-secret-0123456789"
AUTH = (("authorization", f"Bearer {SECRET}"),)


async def started(call: grpc.aio.UnaryStreamCall) -> bool:  # type: ignore[type-arg]
    """Whether the stream's first event is ``started``."""
    first = await call.read()
    return bool(first is not grpc.aio.EOF and first.HasField("started"))


@cpu_heavy
@pytest.mark.slow
async def test_four_thousand_streams_opened_at_once_all_start_and_deliver(
    redis_server: RedisServer,
) -> None:
    # Past gRPC's default queue of calls not yet taken by the server (1,000 soft, 3,000
    # hard), which cancelled every stream beyond about 1,800 with a bare CANCELLED.
    streams, connections = 4_000, 4
    gateway = GatewayProcess(redis_server.url, (SECRET,))
    await gateway.start()
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(gateway.target, options=options) for _ in range(4)]
    stubs = [queue_service_pb2_grpc.QueueServiceStub(c) for c in channels]
    names = [f"burst-{i}" for i in range(streams)]
    try:
        ttl = duration_pb2.Duration(seconds=600)
        for start in range(0, streams, 500):
            await asyncio.gather(
                *(
                    stubs[i % connections].AttachQueue(
                        pb.AttachQueueRequest(queue=n, ttl=ttl), metadata=AUTH
                    )
                    for i, n in enumerate(names[start : start + 500])
                )
            )
        calls = [
            stubs[i % connections].Consume(pb.ConsumeRequest(queue=n), metadata=AUTH)
            for i, n in enumerate(names)
        ]
        assert all(await asyncio.wait_for(asyncio.gather(*(started(c) for c in calls)), 120))
        one = [types_pb2.OutgoingMessage(payload=b"hi")]
        pushes = [pb.PushRequest(queue=n, messages=one) for n in names]
        for start in range(0, streams, 500):
            request = pb.PushManyRequest(pushes=pushes[start : start + 500])
            await stubs[0].PushMany(request, metadata=AUTH)

        async def delivered(call: grpc.aio.UnaryStreamCall) -> bool:  # type: ignore[type-arg]
            while (response := await call.read()) is not grpc.aio.EOF:
                if response.HasField("delivery"):
                    call.cancel()
                    return True
            return False

        assert all(await asyncio.wait_for(asyncio.gather(*(delivered(c) for c in calls)), 120))
    finally:
        for channel in channels:
            await channel.close()
        await gateway.stop()


@pytest.fixture
async def limited_gateway(redis_server: RedisServer) -> AsyncIterator[Gateway]:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        secrets=(SECRET,),
        bus=fast_settings([redis_server.url]),
        max_streams=20,
    )
    async with running_gateway(settings) as gateway:
        yield gateway


async def test_a_stream_past_max_streams_is_refused_with_the_limit_and_a_log_line(
    limited_gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{limited_gateway.port}") as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        await queues.AttachQueue(pb.AttachQueueRequest(queue="capped"), metadata=AUTH)
        held = [queues.Consume(pb.ConsumeRequest(queue="capped"), metadata=AUTH) for _ in range(20)]
        assert all(await asyncio.gather(*(started(c) for c in held)))
        with caplog.at_level(logging.WARNING, logger="busmq_gateway"):
            for _ in range(3):
                refused = queues.Consume(pb.ConsumeRequest(queue="capped"), metadata=AUTH)
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await refused.read()
                assert error.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                info = error_info(error.value)
                assert (info.reason, dict(info.metadata)) == (
                    "GATEWAY_STREAM_LIMIT",
                    {"max_streams": "20"},
                )
        lines = [r for r in caplog.records if "GATEWAY_STREAM_LIMIT" in r.getMessage()]
        assert len(lines) == 1, "three refusals, one throttled log line"
        # A slot freed is a slot taken: the gateway keeps serving.
        held[0].cancel()
        for _ in range(50):
            again = queues.Consume(pb.ConsumeRequest(queue="capped"), metadata=AUTH)
            try:
                if await started(again):
                    break
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # not freed yet
                await asyncio.sleep(0.02)
        else:
            raise AssertionError("no stream started after one was cancelled")
        for call in (*held, again):
            call.cancel()
