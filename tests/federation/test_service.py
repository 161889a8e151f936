"""A federated service has the service API and events, whichever side the handler is on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from busmq import (
    Bus,
    BusClosedError,
    BusUnavailableError,
    Event,
    InvalidMessageError,
    Request,
    RequestTimeoutError,
    Service,
    ServiceError,
)
from busmq.federation import (
    FederatedService,
    FederationUnauthorizedError,
    InvalidRequestError,
    LinkState,
)
from busmq.service import Handler
from tests.federation.conftest import DatacenterA, MakeB
from tests.support.waiting import eventually


@contextlib.asynccontextmanager
async def serving(
    service: Service | FederatedService, handler: Any, **options: Any
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``service.serve(handler)`` in a task for the duration of the block."""
    started = asyncio.Event()
    service.events.on(lambda e: started.set() if e.kind == "serving" else None)
    task = asyncio.create_task(service.serve(handler, **options))
    waiter = asyncio.ensure_future(started.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task in done:
        task.result()  # serve() failed: its error is the test's
    assert started.is_set(), "serve() did not start"
    try:
        yield task
    finally:
        service.stop_serving()
        await asyncio.wait_for(task, 10)


async def counting(n: int, fail_at: int | None = None) -> AsyncIterator[int]:
    for i in range(n):
        if i == fail_at:
            raise LookupError(f"failed at {i}")
        yield i


async def handler(request: Request) -> Any:
    """Echoes (JSON with the headers and delivery count; text upper-cased; bytes
    reversed); ``{"count": n}`` streams 0..n-1 (``fail_at`` raises on the way);
    ``{"fail": msg}`` raises LookupError; ``{"nested": msg}`` passes on a ServiceError;
    ``{"unencodable": ...}`` returns a set; ``{"slow": s}`` answers after ``s`` seconds."""
    data = request.data
    if isinstance(data, dict):
        if "count" in data:
            return counting(data["count"], data.get("fail_at"))
        if "fail" in data:
            raise LookupError(data["fail"])
        if "unencodable" in data:
            return {1, 2}
        if "nested" in data:
            raise ServiceError("inner", "KeyError", data["nested"])
        if "slow" in data:
            await asyncio.sleep(data["slow"])  # the handler's own pace, not a test wait
            return "slow"
        return {"data": data, "headers": request.headers, "delivery_count": request.delivery_count}
    if isinstance(data, bytes):
        return data[::-1]
    if isinstance(data, str):
        return data.upper()
    return data


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


async def federated(bus: Bus, dc_a: DatacenterA, name: str, **options: Any) -> FederatedService:
    remote = bus.federate(bus.service(name, **options), dc_a.url)
    assert isinstance(remote, FederatedService)
    assert await remote.link.wait_usable(10)
    return remote


async def check_replies(service: Service | FederatedService) -> None:
    """Unary, streamed and failing requests, as every requester sees them."""
    assert await service.request({"n": 1}, headers={"trace": "t1"}) == {
        "data": {"n": 1},
        "headers": {"trace": "t1"},
        "delivery_count": 1,
    }
    assert await service.request("quote") == "QUOTE"
    assert await service.request(b"\x01\x02") == b"\x02\x01"
    assert await collect(service.request_stream({"count": 300})) == list(range(300))
    assert await collect(service.request_stream({"count": 0})) == []
    assert await service.request({"count": 3}) == [0, 1, 2]  # a whole streamed reply
    assert await collect(service.request_stream("one")) == ["ONE"]  # a unary reply

    with pytest.raises(ServiceError) as caught:
        await service.request({"fail": "no price"})
    assert (caught.value.service, caught.value.error_type) == ("pricing", "LookupError")
    assert caught.value.detail == "no price"
    with pytest.raises(ServiceError) as caught:
        await service.request({"nested": "gone"})  # passed on with its original type
    assert (caught.value.error_type, caught.value.detail) == ("KeyError", "gone")
    with pytest.raises(ServiceError) as caught:
        await service.request({"unencodable": True})  # a value that is not a message
    assert caught.value.error_type == "InvalidMessageError"
    got: list[int] = []
    with pytest.raises(ServiceError) as caught:
        async for item in service.request_stream({"count": 5, "fail_at": 3}):
            got.append(item)
    assert got == [0, 1, 2] and caught.value.error_type == "LookupError"
    with pytest.raises(InvalidMessageError):
        await service.request("x", headers={"busmq-reply-to": "elsewhere"})


# -- the handler in A, the requester federated in B ----------------------------------


async def test_a_federated_requester_gets_replies_streams_and_handler_errors(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = await federated(dc_b, dc_a, "pricing", timeout=5)
    events: list[Event] = []
    remote.events.on(events.append)
    async with dc_a.bus.service("pricing") as local, serving(local, handler):
        await check_replies(remote)
    assert not any(e.kind == "error" for e in events)


async def test_a_federated_request_times_out_with_a_typed_error(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = await federated(dc_b, dc_a, "pricing", timeout=5)
    async with dc_a.bus.service("pricing") as local, serving(local, handler):
        started = asyncio.get_running_loop().time()
        with pytest.raises(RequestTimeoutError) as caught:
            await remote.request({"slow": 1.0}, timeout=0.3)
        elapsed = asyncio.get_running_loop().time() - started
        # The gateway's timeout, not the call's deadline (0.3 s + the margin).
        assert elapsed < 0.9, elapsed
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.service == "pricing" and caught.value.timeout == 0.3
        assert caught.value.correlation_id
        with pytest.raises(RequestTimeoutError):
            await collect(remote.request_stream({"slow": 1.0}, timeout=0.3))
        # The link was not blamed for a slow handler.
        assert remote.state is LinkState.READY
        assert await remote.request("still fine") == "STILL FINE"


async def test_two_hundred_concurrent_federated_requests_each_get_their_own_reply(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = await federated(dc_b, dc_a, "pricing", timeout=20)
    async with dc_a.bus.service("pricing") as local, serving(local, handler, concurrency=32):
        replies = await asyncio.gather(*(remote.request({"n": n}) for n in range(200)))
    assert [r["data"]["n"] for r in replies] == list(range(200))


def holding(held: asyncio.Event, release: asyncio.Event) -> Handler:
    """A handler that holds ``"hold"`` requests (setting ``held``) until ``release``."""

    async def hold(request: Request) -> Any:
        if request.data == "hold":
            held.set()
            await release.wait()
            return "released"
        return await handler(request)

    return hold


async def test_requests_fail_fast_while_the_link_is_cut_and_work_again_after(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = await federated(dc_b, dc_a, "pricing", timeout=10)
    held, release = asyncio.Event(), asyncio.Event()
    async with dc_a.bus.service("pricing") as local, serving(local, holding(held, release)):
        assert await remote.request("before") == "BEFORE"
        # A request in flight when the link is cut fails with a typed error: the call
        # broke, so whether the handler ran is unknown; requests are never queued.
        in_flight = asyncio.create_task(remote.request("hold"))
        await asyncio.wait_for(held.wait(), 10)
        await dc_a.proxy.cut()
        with pytest.raises(BusUnavailableError):
            await in_flight
        release.set()
        await eventually(lambda: not remote.link.usable, what="link down")

        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BusUnavailableError):
            await remote.request("during")
        with pytest.raises(BusUnavailableError):
            await collect(remote.request_stream({"count": 2}))
        assert loop.time() - started < 0.5  # at once, not after the timeout

        await dc_a.proxy.restore()
        assert await remote.link.wait_usable(10)
        assert await remote.request("after") == "AFTER"


async def test_closing_a_federated_service_fails_its_waiting_requests(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = await federated(dc_b, dc_a, "pricing", timeout=10)
    held, release = asyncio.Event(), asyncio.Event()
    async with dc_a.bus.service("pricing") as local, serving(local, holding(held, release)):
        waiting = asyncio.create_task(remote.request("hold"))
        await asyncio.wait_for(held.wait(), 10)
        await remote.close()
        with pytest.raises(BusClosedError):
            await waiting
        with pytest.raises(BusClosedError):
            await remote.request("after close")
        release.set()


# -- the handler federated in B, the requester in A -----------------------------------


async def test_a_federated_handler_answers_local_requesters(dc_a: DatacenterA, dc_b: Bus) -> None:
    remote = await federated(dc_b, dc_a, "pricing")
    events: list[Event] = []
    remote.events.on(events.append)
    async with (
        serving(remote, handler, concurrency=8),
        dc_a.bus.service("pricing", timeout=5) as local,
    ):
        await check_replies(local)
        replies = await asyncio.gather(*(local.request({"n": n}) for n in range(100)))
        assert [r["data"]["n"] for r in replies] == list(range(100))
    serving_events = [e for e in events if e.kind == "serving"]
    assert serving_events[0].details == {"concurrency": 8}
    assert serving_events[0].source == "pricing"
    assert [e.kind for e in events if e.source == "pricing"][-1] == "stopped"
    assert not any(e.kind == "error" for e in events)


async def test_a_federated_handler_that_stops_serving_finishes_the_requests_it_has(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = await federated(dc_b, dc_a, "pricing")
    held, release = asyncio.Event(), asyncio.Event()
    async with dc_a.bus.service("pricing", timeout=10) as local:
        async with serving(remote, holding(held, release)) as task:
            answer = asyncio.create_task(local.request("hold"))
            await asyncio.wait_for(held.wait(), 10)
            remote.stop_serving()
            await asyncio.sleep(0.2)  # an observation window: serve() must not return yet
            assert not task.done()
            release.set()
        # serve() returned after answering the request in hand.
        assert await answer == "released"


async def test_a_federated_handler_resumes_after_a_cut_and_in_flight_requests_are_redelivered(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = await federated(dc_b, dc_a, "pricing")
    events: list[Event] = []
    remote.events.on(events.append)
    held = asyncio.Event()
    release = asyncio.Event()

    async def first_time_holds(request: Request) -> Any:
        if request.data == "in flight" and request.delivery_count == 1:
            held.set()
            await release.wait()
            return "late"  # its stream broke meanwhile: this reply is dropped
        return f"{request.data}: delivery {request.delivery_count}"

    def service_errors() -> list[Event]:
        return [e for e in events if e.kind == "error" and e.source == "pricing"]

    async with dc_a.bus.service("pricing", timeout=20) as local:
        async with serving(remote, first_time_holds):
            assert await local.request("before") == "before: delivery 1"
            in_flight = asyncio.create_task(local.request("in flight"))
            await asyncio.wait_for(held.wait(), 10)
            await dc_a.proxy.cut()
            await eventually(lambda: bool(service_errors()), what="stream broke")
            await dc_a.proxy.restore()
            await eventually(
                lambda: any(e.details.get("resumed") for e in events if e.kind == "serving"),
                what="serving resumed",
            )
            # The gateway gave the request back when the stream broke; it came again on
            # the new stream and was answered within the requester's timeout.
            assert await in_flight == "in flight: delivery 2"
            assert await local.request("after") == "after: delivery 1"
            errors = len(service_errors())
            release.set()  # the first handling ends; its late reply finds the request gone
        # serve() returned once the late handler was done; its reply was dropped quietly.
        assert len(service_errors()) == errors
    assert all(isinstance(e.error, BusUnavailableError) for e in service_errors())
    assert any(e.kind == "ready" and e.source == remote.target for e in events)


async def test_a_federated_handler_refused_by_the_gateway_ends_serve_with_the_error(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = await federated(dc_b, dc_a, "pricing")
    with pytest.raises(InvalidRequestError):  # above the gateway's max_prefetch
        await remote.serve(handler, concurrency=5000)
    with pytest.raises(ValueError):
        await remote.serve(handler, concurrency=0)


async def test_closing_the_bus_ends_a_federated_serve(dc_a: DatacenterA, make_b: MakeB) -> None:
    bus = await make_b()
    remote = await federated(bus, dc_a, "pricing")
    started = asyncio.Event()
    remote.events.on(lambda e: started.set() if e.kind == "serving" else None)
    task = asyncio.create_task(remote.serve(handler))
    await asyncio.wait_for(started.wait(), 10)
    await bus.close()
    await asyncio.wait_for(task, 10)  # returned, without an error


# -- credentials ---------------------------------------------------------------------


async def test_a_wrong_secret_makes_requests_and_serve_fail_as_unauthorized(
    dc_a: DatacenterA, make_b: MakeB
) -> None:
    bus = await make_b(secret="not-the-secret")
    remote = bus.federate(bus.service("pricing"), dc_a.url)
    kinds: list[str] = []
    remote.events.on(lambda event: kinds.append(event.kind))
    await eventually(lambda: remote.state is LinkState.UNAUTHORIZED, what="unauthorized")
    with pytest.raises(FederationUnauthorizedError):
        await remote.request("refused")
    with pytest.raises(FederationUnauthorizedError):
        await collect(remote.request_stream("refused"))
    with pytest.raises(FederationUnauthorizedError):
        await remote.serve(handler)
    assert "unauthorized" in kinds
