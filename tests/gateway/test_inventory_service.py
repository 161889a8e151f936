"""ListQueues and BrowseQueue: the operator's read-only views over gRPC."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from busmq import Bus, Mode
from busmq.v1 import queue_service_pb2 as pb
from tests.gateway.conftest import AUTH, GatewayUnderTest, Stream, error_info


async def test_list_queues_pages_by_name_with_a_prefix(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    for n in range(25):
        queue = peer_bus.queue(f"app.q{n:02d}")
        await queue.attach(ttl=60)
        await queue.push_batch(["x"] * n)
    await peer_bus.queue("other").attach(ttl=60)

    names: list[str] = []
    token, pages = "", 0
    while True:
        request = pb.ListQueuesRequest(prefix="app.", page_size=10, page_token=token)
        response = await gateway.queues.ListQueues(request, metadata=AUTH)
        assert response.total == 25
        names += [q.queue for q in response.queues]
        pages += 1
        token = response.next_page_token
        if not token:
            break
    assert pages == 3
    assert names == [f"app.q{n:02d}" for n in range(25)]

    everything = await gateway.queues.ListQueues(pb.ListQueuesRequest(), metadata=AUTH)
    assert everything.total == 26 and not everything.next_page_token
    by_name = {q.queue: q for q in everything.queues}
    assert by_name["app.q07"].count == by_name["app.q07"].ready == 7
    assert by_name["app.q07"].last_id == 7 and by_name["app.q07"].attachments == 1

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gateway.queues.ListQueues(pb.ListQueuesRequest(page_size=10_001), metadata=AUTH)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_browse_reads_without_consuming_and_follows(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    queue = peer_bus.queue("browsed")
    await queue.attach(ttl=60)
    await queue.push_batch([f"m{n}" for n in range(1, 1201)])

    async def browse(**fields: object) -> list[int]:
        ids: list[int] = []
        call = gateway.queues.BrowseQueue(pb.BrowseQueueRequest(queue="browsed", **fields),
                                          metadata=AUTH)  # fmt: skip
        async for response in call:
            ids += [m.id for m in response.messages.messages]
        return ids

    assert await browse() == list(range(1, 1201))  # several pages
    assert await browse(from_id=100, to_id=110) == list(range(100, 111))
    assert await queue.count() == 1200
    info = await queue.info()
    assert info.mode is None and info.pending == 0  # no consumer group, no mode fixed

    follow = Stream[pb.BrowseQueueResponse](
        gateway.queues.BrowseQueue(
            pb.BrowseQueueRequest(queue="browsed", from_id=1200, follow=True), metadata=AUTH
        )
    )
    first = await follow.next()
    assert [m.payload for m in first.messages.messages] == [b"m1200"]
    await queue.push("new", headers={"h": "1"})
    later = await follow.next()
    [message] = later.messages.messages
    assert (message.id, message.payload, dict(message.headers)) == (1201, b"new", {"h": "1"})
    assert gateway.gateway.queues.browses.active_streams == 1
    follow.cancel()
    for _ in range(100):
        if gateway.gateway.queues.browses.active_streams == 0:
            break
        await asyncio.sleep(0.02)  # polling: the cancel reaches the gateway's task
    assert gateway.gateway.queues.browses.active_streams == 0

    async with queue.consume(Mode.AT_MOST_ONCE, max=1) as consumer:
        assert (await consumer.__anext__()).id == 1  # the queue was not touched by browsing


async def test_browse_refuses_a_missing_queue_and_bad_ranges(gateway: GatewayUnderTest) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        async for _ in gateway.queues.BrowseQueue(
            pb.BrowseQueueRequest(queue="nope"), metadata=AUTH
        ):
            pass
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    assert error_info(missing.value).reason == "QUEUE_NOT_FOUND"
    for fields in ({"from_id": 5, "to_id": 2}, {"to_id": 9, "follow": True}):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in gateway.queues.BrowseQueue(
                pb.BrowseQueueRequest(queue="nope", **fields), metadata=AUTH
            ):
                pass
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
