"""The seam between the service API and its backends: ``ServeRun`` runs a handler and
sends its reply to a ``ReplySink`` the same way whatever carries it (pure logic, a
recording sink; the local and federated suites run it over Redis and a gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from busmq import Service
from busmq.errors import BusError, ServiceError
from busmq.events import Event, EventHub
from busmq.federation import FederatedService
from busmq.message import Message
from busmq.service_api import (
    Handler,
    NotAwaited,
    ReplyFailed,
    Request,
    ServeRun,
    ServiceAPI,
)


class RecordingSink:
    """A reply sink that records what it was sent; ``fail`` makes a kind of reply
    raise the given exception."""

    def __init__(self, fail: dict[str, Exception] | None = None) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.finished: list[bool] = []
        self.given_back = False
        self._fail = fail or {}

    def _record(self, kind: str, value: Any) -> None:
        if kind in self._fail:
            raise self._fail[kind]
        self.sent.append((kind, value))

    async def value(self, value: Any) -> None:
        self._record("value", value)

    async def stream(self, items: AsyncIterator[Any]) -> None:
        self._record("stream", [item async for item in items])

    async def error(self, error_type: str, message: str) -> None:
        self._record("error", (error_type, message))

    async def finish(self, replied: bool) -> None:
        self.finished.append(replied)

    async def give_back(self) -> None:
        self.given_back = True


def request(data: bytes = b"x") -> Request:
    return Request(Message(id=1, payload=data))


async def handle(handler: Handler, sink: RecordingSink) -> list[Event]:
    events: EventHub[Event] = EventHub()
    seen: list[Event] = []
    events.on(seen.append)
    run = ServeRun("svc", events, handler, concurrency=1, visibility_timeout=30)
    await run.dispatch(request(), sink, unless_stopping=False)
    await run.finish_running()
    return seen


def test_both_services_are_one_api() -> None:
    assert issubclass(Service, ServiceAPI)
    assert issubclass(FederatedService, ServiceAPI)
    assert Service.request is FederatedService.request
    assert Service.serve is FederatedService.serve


async def test_a_value_is_sent_and_the_request_settled() -> None:
    async def double(req: Request) -> bytes:
        return bytes(req.data) * 2

    sink = RecordingSink()
    await handle(double, sink)
    assert sink.sent == [("value", b"xx")]
    assert sink.finished == [True]


async def test_a_generator_streams_and_a_coroutine_may_return_a_stream() -> None:
    async def items(req: Request) -> AsyncIterator[int]:
        for i in range(3):
            yield i

    async def decides(req: Request) -> AsyncIterator[int]:
        return items(req)

    for handler in (items, decides):
        sink = RecordingSink()
        await handle(handler, sink)
        assert sink.sent == [("stream", [0, 1, 2])]
        assert sink.finished == [True]


async def test_a_handler_error_goes_back_with_its_type_and_a_passed_on_one_with_the_original() -> (
    None
):
    async def broken(req: Request) -> None:
        raise KeyError("nope")

    async def proxy(req: Request) -> None:
        raise ServiceError("other", "LookupError", "far away")

    sink = RecordingSink()
    await handle(broken, sink)
    assert sink.sent == [("error", ("KeyError", "'nope'"))]
    assert sink.finished == [True]

    sink = RecordingSink()
    await handle(proxy, sink)
    assert sink.sent == [("error", ("LookupError", "far away"))]


async def test_a_reply_that_failed_in_transit_leaves_the_request_unsettled() -> None:
    async def ok(req: Request) -> bytes:
        return b"ok"

    async def broken(req: Request) -> None:
        raise RuntimeError("boom")

    failure = BusError("redis went away")
    for handler, kind in ((ok, "value"), (broken, "error")):
        sink = RecordingSink(fail={kind: ReplyFailed(failure)})
        seen = await handle(handler, sink)
        assert sink.finished == [False]
        assert [(e.kind, e.error) for e in seen] == [("error", failure)]


async def test_a_reply_nobody_awaits_is_dropped_and_the_request_settled() -> None:
    async def ok(req: Request) -> bytes:
        return b"ok"

    sink = RecordingSink(fail={"value": NotAwaited()})
    seen = await handle(ok, sink)
    assert sink.finished == [True]
    assert seen == []


async def test_a_cancelled_handler_gives_its_request_back() -> None:
    started = asyncio.Event()

    async def stuck(req: Request) -> None:
        started.set()
        await asyncio.Event().wait()

    sink = RecordingSink()
    run = ServeRun("svc", EventHub(), stuck, concurrency=1, visibility_timeout=30)
    await run.dispatch(request(), sink, unless_stopping=False)
    await started.wait()
    await run.cancel_running()
    assert sink.given_back
    assert sink.finished == []


async def test_a_stopping_run_takes_no_more_requests_when_asked_not_to() -> None:
    async def ok(req: Request) -> bytes:
        return b"ok"

    sink = RecordingSink()
    run = ServeRun("svc", EventHub(), ok, concurrency=1, visibility_timeout=30)
    run.stop()
    await run.dispatch(request(), sink, unless_stopping=True)
    await run.finish_running()
    assert sink.sent == []
    await run.dispatch(request(), sink, unless_stopping=False)
    await run.finish_running()
    assert sink.sent == [("value", b"ok")]


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_no_more_handlers_run_at_once_than_the_concurrency(concurrency: int) -> None:
    running = 0
    most = 0
    gate = asyncio.Event()
    full = asyncio.Event()

    async def slow(req: Request) -> bytes:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == concurrency:
            full.set()
        await gate.wait()
        running -= 1
        return b"done"

    run = ServeRun("svc", EventHub(), slow, concurrency=concurrency, visibility_timeout=30)
    sinks = [RecordingSink() for _ in range(concurrency + 2)]
    dispatching = asyncio.ensure_future(
        asyncio.gather(*(run.dispatch(request(), s, unless_stopping=False) for s in sinks))
    )
    await full.wait()
    assert not dispatching.done()  # the rest wait for a slot
    gate.set()
    await dispatching
    await run.finish_running()
    assert most == concurrency
    assert all(s.finished == [True] for s in sinks)
