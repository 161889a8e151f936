"""RequestService through the generated stub: gRPC requesters and handlers, core on either side."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from busmq import Bus, Request, Service, ServiceError
from busmq.v1 import request_service_pb2 as pb
from busmq.v1 import types_pb2
from tests.gateway.conftest import AUTH, GatewayUnderTest, Stream, error_info

BYTES = types_pb2.PAYLOAD_KIND_BYTES
TEXT = types_pb2.PAYLOAD_KIND_TEXT
JSON = types_pb2.PAYLOAD_KIND_JSON
LONG = duration_pb2.Duration(seconds=300)


def as_json(value: Any, **headers: str) -> types_pb2.OutgoingMessage:
    return types_pb2.OutgoingMessage(payload=json.dumps(value).encode(), kind=JSON, headers=headers)


def reply_json(value: Any) -> pb.ReplyPayload:
    return pb.ReplyPayload(payload=json.dumps(value).encode(), kind=JSON)


@contextlib.asynccontextmanager
async def serving(service: Service, handler: Any) -> AsyncIterator[None]:
    """Run ``service.serve(handler)`` on the core side for the duration of the block."""
    started = asyncio.Event()
    service.events.on(lambda e: started.set() if e.kind == "serving" else None)
    task = asyncio.create_task(service.serve(handler))
    await asyncio.wait_for(started.wait(), 5)
    try:
        yield
    finally:
        service.stop_serving()
        await asyncio.wait_for(task, 5)


async def counting(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


async def handler(request: Request) -> Any:
    """Echoes; ``{"count": n}`` streams 0..n-1; ``{"fail": msg}`` raises LookupError."""
    data = request.data
    if isinstance(data, dict) and "count" in data:
        return counting(data["count"])  # a coroutine may return a stream
    if isinstance(data, dict) and "fail" in data:
        raise LookupError(data["fail"])
    if isinstance(data, bytes):
        return data[::-1]
    if isinstance(data, str):
        return data.upper()
    return {"data": data, "headers": request.headers}


async def call(gw: GatewayUnderTest, service: str, message: Any, **fields: Any) -> Any:
    response = await gw.requests.Call(
        pb.CallRequest(service=service, request=message, **fields), metadata=AUTH
    )
    return response.reply


async def test_call_gets_the_reply_of_a_core_handler(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    async with peer_bus.service("echo") as service, serving(service, handler):
        reply = await call(gateway, "echo", as_json({"n": 1}, trace="t1"))
        assert reply.kind == JSON
        assert json.loads(reply.payload) == {"data": {"n": 1}, "headers": {"trace": "t1"}}
        text = await call(gateway, "echo", types_pb2.OutgoingMessage(payload=b"hi", kind=TEXT))
        assert (text.payload, text.kind) == (b"HI", TEXT)
        raw = await call(gateway, "echo", types_pb2.OutgoingMessage(payload=b"\x00\x01"))
        assert (raw.payload, raw.kind) == (b"\x01\x00", BYTES)
        # A streamed reply, whole: the JSON array of its items.
        whole = await call(gateway, "echo", as_json({"count": 3}))
        assert json.loads(whole.payload) == [0, 1, 2]


async def test_call_stream_streams_the_items_in_order_then_ends(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    async with peer_bus.service("counter") as service, serving(service, handler):
        stream: Stream[pb.CallStreamResponse] = Stream(
            gateway.requests.CallStream(
                pb.CallStreamRequest(service="counter", request=as_json({"count": 20})),
                metadata=AUTH,
            )
        )
        items = [(k, json.loads(v.payload)) for k, v in await stream.rest()]  # type: ignore[attr-defined]
        assert items == [("item", i) for i in range(20)]
        # A unary reply is a stream of one item.
        single: Stream[pb.CallStreamResponse] = Stream(
            gateway.requests.CallStream(
                pb.CallStreamRequest(service="counter", request=as_json(7)), metadata=AUTH
            )
        )
        assert [(k, v.payload) for k, v in await single.rest()] == [  # type: ignore[attr-defined]
            ("item", b'{"data":7,"headers":{}}')
        ]


async def test_a_handler_error_is_aborted_with_its_type(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    async with peer_bus.service("picky") as service, serving(service, handler):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call(gateway, "picky", as_json({"fail": "no such thing"}))
        assert error.value.code() is grpc.StatusCode.ABORTED
        info = error_info(error.value)
        assert info.reason == "HANDLER_FAILED"
        assert dict(info.metadata) == {
            "service": "picky",
            "error_type": "LookupError",
            "detail": "no such thing",
        }
        assert "no such thing" in (error.value.details() or "")


async def test_no_reply_in_time_is_deadline_exceeded(gateway: GatewayUnderTest) -> None:
    short = duration_pb2.Duration(nanos=300_000_000)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call(gateway, "nobody", as_json(1), timeout=short)
    assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert error_info(error.value).reason == "REQUEST_TIMEOUT"
    with pytest.raises(grpc.aio.AioRpcError) as stream_error:
        async for _ in gateway.requests.CallStream(
            pb.CallStreamRequest(service="nobody", request=as_json(1), timeout=short),
            metadata=AUTH,
        ):
            pass
    assert stream_error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # Without a timeout, the call's own deadline bounds the wait.
    with pytest.raises(grpc.aio.AioRpcError) as deadline:
        await gateway.requests.Call(
            pb.CallRequest(service="nobody", request=as_json(1)), metadata=AUTH, timeout=0.5
        )
    assert deadline.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED


def serve(gw: GatewayUnderTest, service: str, **fields: Any) -> Stream[pb.ServeResponse]:
    return Stream(gw.requests.Serve(pb.ServeRequest(service=service, **fields), metadata=AUTH))


async def reply(gw: GatewayUnderTest, request_id: str, **fields: Any) -> None:
    await gw.requests.Reply(pb.ReplyRequest(request_id=request_id, **fields), metadata=AUTH)


async def test_serve_hands_requests_to_a_grpc_handler_that_replies_in_every_form(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    handler_stream = serve(gateway, "remote", visibility_timeout=LONG)
    assert (await handler_stream.next()).started.concurrency == 16
    requester = peer_bus.service("remote")

    # A value, to a core requester.
    asked = asyncio.create_task(requester.request({"q": 1}, headers={"trace": "t2"}, timeout=10))
    served = (await handler_stream.next()).request
    assert json.loads(served.message.payload) == {"q": 1}
    assert dict(served.message.headers) == {"trace": "t2"}  # the reserved ones are not shown
    assert served.delivery_count == 1
    await reply(gateway, served.request_id, value=reply_json({"a": 1}))
    assert await asyncio.wait_for(asked, 10) == {"a": 1}

    # A streamed reply, sent in two Reply calls; a value after chunks is refused.
    async def collect() -> list[Any]:
        return [item async for item in requester.request_stream("items", timeout=10)]

    streamed = asyncio.create_task(collect())
    served = (await handler_stream.next()).request
    await reply(gateway, served.request_id, chunks=pb.ReplyChunks(items=[reply_json("a")]))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await reply(gateway, served.request_id, value=reply_json("x"))
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    last = pb.ReplyChunks(
        items=[reply_json("b"), pb.ReplyPayload(payload=b"c", kind=TEXT)], end=True
    )
    await reply(gateway, served.request_id, chunks=last)
    assert await asyncio.wait_for(streamed, 10) == ["a", "b", "c"]

    # An error: the requester gets a ServiceError of that type.
    failing = asyncio.create_task(requester.request("boom", timeout=10))
    served = (await handler_stream.next()).request
    await reply(gateway, served.request_id, error=pb.ReplyError(type="KeyError", message="gone"))
    with pytest.raises(ServiceError) as caught:
        await asyncio.wait_for(failing, 10)
    assert (caught.value.error_type, caught.value.detail) == ("KeyError", "gone")

    # gRPC on both sides: Call through the gateway to the gRPC handler.
    grpc_call = asyncio.create_task(call(gateway, "remote", as_json("ping")))
    served = (await handler_stream.next()).request
    with pytest.raises(grpc.aio.AioRpcError) as empty:
        await reply(gateway, served.request_id)
    assert empty.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    await reply(gateway, served.request_id, value=reply_json("pong"))
    pong = await asyncio.wait_for(grpc_call, 10)
    assert (pong.payload, pong.kind) == (b"pong", TEXT)  # a string is text, as in the core
    with pytest.raises(grpc.aio.AioRpcError) as answered:
        await reply(gateway, served.request_id, value=reply_json("again"))
    assert answered.value.code() is grpc.StatusCode.NOT_FOUND
    handler_stream.cancel()
    await requester.close()


async def test_requests_unanswered_when_a_serve_stream_ends_go_to_another_handler(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    first = serve(gateway, "handover", visibility_timeout=LONG)
    await first.next()
    requester = peer_bus.service("handover")
    asked = asyncio.create_task(requester.request("work", timeout=20))
    taken = (await first.next()).request
    first.cancel()
    # Well before the 300 s visibility timeout, another handler gets it again.
    second = serve(gateway, "handover", visibility_timeout=LONG)
    await second.next()
    again = (await second.next()).request
    assert (again.message.id, again.delivery_count) == (taken.message.id, 2)
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await reply(gateway, taken.request_id, value=reply_json("late"))
    assert stale.value.code() is grpc.StatusCode.NOT_FOUND
    await reply(gateway, again.request_id, value=reply_json("done"))
    assert await asyncio.wait_for(asked, 10) == "done"
    second.cancel()
    await requester.close()


async def test_draining_ends_serve_streams_cleanly(gateway: GatewayUnderTest) -> None:
    stream = serve(gateway, "draining")
    await stream.next()
    await gateway.gateway.stop()
    assert await stream.rest() == [("state", "draining")]
