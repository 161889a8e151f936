from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from busmq import Bus, InvalidMessageError, InvalidNameError, Queue
from busmq.service import (
    CORRELATION_ID,
    REPLY_TO,
    Request,
    RequestTimeoutError,
    Service,
    ServiceError,
)
from tests.support.processes import HelperProcess
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually


@contextlib.asynccontextmanager
async def serving(service: Service, handler: Any, **options: Any) -> AsyncIterator[None]:
    """Run ``service.serve(handler)`` in this process for the duration of the block."""
    started = asyncio.Event()
    service.events.on(lambda e: started.set() if e.kind == "serving" else None)
    task = asyncio.create_task(service.serve(handler, **options))
    await asyncio.wait_for(started.wait(), 5)
    try:
        yield
    finally:
        service.stop_serving()
        await asyncio.wait_for(task, 5)


async def test_a_thousand_concurrent_requests_to_three_handler_processes_get_their_replies(
    shard_urls: list[str], make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus(shard_urls)
    workers = [HelperProcess("service_worker", json.dumps(shard_urls), "math") for _ in range(3)]
    try:
        for worker in workers:
            await worker.start()
        for worker in workers:
            await worker.read_until("event", "serving")
        async with Service(bus, "math", timeout=20) as service:
            replies = await asyncio.gather(
                *(service.request({"op": "double", "n": n}) for n in range(1000))
            )
        assert [(r["n"], r["double"]) for r in replies] == [(n, 2 * n) for n in range(1000)]
        assert {r["pid"] for r in replies} == {w.pid for w in workers}
    finally:
        for worker in workers:
            await worker.stop()


async def test_streamed_replies_from_a_handler_process_arrive_in_order_and_end(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    urls = [redis_server.url]
    bus: Bus = await make_bus(urls)
    worker = await HelperProcess("service_worker", json.dumps(urls), "counter").start()
    try:
        await worker.read_until("event", "serving")
        async with Service(bus, "counter", timeout=5) as service:
            streams = [service.request_stream({"op": "count", "to": k}) for k in (0, 1, 300)]
            results = await asyncio.gather(*(_collect(s) for s in streams))
            assert results == [[], [0], list(range(300))]
            # request() on a streaming handler gathers the items.
            assert await service.request({"op": "count", "to": 3}) == [0, 1, 2]
    finally:
        await worker.stop()


async def test_a_request_whose_handler_process_died_is_answered_by_another(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    urls = [redis_server.url]
    bus: Bus = await make_bus(urls)
    doomed = await HelperProcess("service_worker", json.dumps(urls), "fragile").start()
    rescuer = HelperProcess("service_worker", json.dumps(urls), "fragile")
    try:
        await doomed.read_until("event", "serving")
        async with Service(bus, "fragile", timeout=15) as service:
            answer = asyncio.create_task(service.request({"op": "stall-once"}))
            await doomed.read_until("event", "stalling")
            doomed.kill()
            await doomed.wait()
            await rescuer.start()
            reply = await answer
        # Redelivered after the worker's 2 s visibility timeout.
        assert reply == {"delivery_count": 2, "pid": rescuer.pid}
    finally:
        await doomed.stop()
        await rescuer.stop()


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


async def test_a_request_nobody_answers_times_out_with_a_typed_error(bus: Bus) -> None:
    async with Service(bus, "void") as service:
        with pytest.raises(RequestTimeoutError) as caught:
            await service.request("anyone?", timeout=0.3)
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.service == "void" and caught.value.timeout == 0.3
        with pytest.raises(RequestTimeoutError):
            await _collect(service.request_stream("anyone?", timeout=0.3))


async def test_a_stream_that_stalls_times_out_between_items(bus: Bus) -> None:
    async def slow(request: Request) -> AsyncIterator[str]:
        yield "quick"
        await asyncio.sleep(0.6)  # the handler's stall, past the 0.3 s between items
        yield "too late"

    async with Service(bus, "staller") as service, serving(service, slow):
        got: list[str] = []
        with pytest.raises(RequestTimeoutError):
            async for item in service.request_stream(None, timeout=0.3):
                got.append(item)
        assert got == ["quick"]


async def test_handler_errors_reach_the_requester_as_service_errors(bus: Bus) -> None:
    async def picky(request: Request) -> Any:
        if request.data == "boom":
            raise LookupError("no such thing")
        if request.data == "unencodable":
            return {1, 2}
        return {"data": request.data, "headers": request.headers}

    async with Service(bus, "picky") as service, serving(service, picky, concurrency=2):
        with pytest.raises(ServiceError) as caught:
            await service.request("boom", timeout=5)
        assert (caught.value.error_type, caught.value.detail) == ("LookupError", "no such thing")
        with pytest.raises(ServiceError, match="InvalidMessageError"):
            await service.request("unencodable", timeout=5)
        reply = await service.request("fine", headers={"trace": "t9"}, timeout=5)
        assert reply == {"data": "fine", "headers": {"trace": "t9"}}


async def test_a_requester_that_gave_up_leaks_no_keys(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    replied = asyncio.Event()

    async def slow(request: Request) -> str:
        await asyncio.sleep(0.5)  # the handler replies after the requester gave up
        replied.set()
        return "late"

    async with Service(bus, "slowpoke") as server, serving(server, slow):
        requester = Service(bus, "slowpoke", reply_ttl=0.3)
        with pytest.raises(RequestTimeoutError):
            await requester.request("hello?", timeout=0.1)
        await requester.close()  # gave up: detaches its reply queue
        await asyncio.wait_for(replied.wait(), 5)
        reply_queue = Queue(bus, requester.reply_queue_name)
        await eventually(lambda: _missing(reply_queue), timeout=5, what="reply queue expired")
        # The late reply neither resurrected the reply queue nor left any key behind.
        raw = redis_server.client()
        leftovers = [k async for k in raw.scan_iter(match="*slowpoke:replies*")]
        await raw.aclose()
        assert leftovers == []


async def _missing(queue: Queue) -> bool:
    return not await queue.exists()


async def test_a_request_cannot_direct_replies_into_another_queue(bus: Bus) -> None:
    async def echo(request: Request) -> Any:
        return request.data

    async with (
        Service(bus, "guarded") as service,
        serving(service, echo),
        Queue(bus, "victim") as victim,
        Queue(bus, "guarded:requests") as requests,
    ):
        await requests.push("forged", headers={REPLY_TO: "victim", CORRELATION_ID: "x"})
        assert await service.request("genuine", timeout=5) == "genuine"
        await eventually(lambda: _count_is(requests, 0), what="forged request consumed")
        assert await victim.count() == 0


async def _count_is(queue: Queue, n: int) -> bool:
    return await queue.count() == n


# -- bad input ---------------------------------------------------------------------------


async def test_bad_names_payloads_and_options_are_refused(bus: Bus) -> None:
    with pytest.raises(InvalidNameError):
        Service(bus, "bad name")
    with pytest.raises(InvalidNameError):
        Service(bus, "s" * 151)
    with pytest.raises(ValueError):
        Service(bus, "ok", timeout=0)
    async with Service(bus, "ok") as service:
        with pytest.raises(InvalidMessageError):
            await service.request({"x": object()})
        with pytest.raises(InvalidMessageError, match="reserved"):
            await service.request("x", headers={REPLY_TO: "elsewhere"})
        with pytest.raises(ValueError):
            await service.request("x", timeout=-1)
        with pytest.raises(ValueError):
            await service.serve(lambda r: r.data, concurrency=0)
