"""The gateway's servicers on ``grpc_testing``, without sockets.

``grpc_testing`` runs servicers in-process: every call's metadata, status, details and
trailing metadata can be asserted exactly, streams can be cancelled at a chosen point,
and nothing waits on a network. It drives synchronous servicers only (grpc/grpc#24942:
it calls a method and takes what it returns as the response), and the gateway's are
``grpc.aio`` coroutines and async generators. So :func:`in_process_server` hands it a
synchronous facade per service: each method runs the gateway's *guarded* handler (the
same :class:`~busmq_gateway.guard.Guard` wrapping the server registers: identification,
the access rules, malformed requests, metrics) as a coroutine on the test's event loop,
with :class:`AioContext` standing in for ``grpc.aio.ServicerContext`` over
``grpc_testing``'s context. The test awaits a call's outcome with :func:`outcome` (in a
thread, so that the loop runs the servicer meanwhile).

A call that ``grpc_testing`` ends (``cancel()``, or the test's own deadline) cancels the
servicer's task, as ``grpc.aio`` does when a client goes away.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import grpc
import grpc_testing  # type: ignore[import-untyped]
from google.protobuf import descriptor as pb_descriptor

from busmq.v1 import (
    channel_service_pb2,
    persistable_service_pb2,
    queue_service_pb2,
    request_service_pb2,
)
from busmq_gateway.server import Gateway

SERVICES: Mapping[str, pb_descriptor.ServiceDescriptor] = {
    d.full_name: d
    for d in (
        queue_service_pb2.DESCRIPTOR.services_by_name["QueueService"],
        channel_service_pb2.DESCRIPTOR.services_by_name["ChannelService"],
        persistable_service_pb2.DESCRIPTOR.services_by_name["PersistableService"],
        request_service_pb2.DESCRIPTOR.services_by_name["RequestService"],
    )
}


class AioContext:
    """The part of ``grpc.aio.ServicerContext`` the gateway uses, over ``grpc_testing``'s
    synchronous context."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._code: grpc.StatusCode | None = None

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> None:
        # grpc_testing's own abort drops the trailing metadata (the status details the
        # gateway sends): the call's code, details and trailers are set instead, and the
        # facade completes the call with them when AbortError reaches it.
        self.set_code(code)
        self._context.set_details(details)
        if trailing_metadata:
            self._context.set_trailing_metadata(tuple(trailing_metadata))
        raise grpc.aio.AbortError()

    async def abort_with_status(self, status: grpc.Status) -> None:
        await self.abort(status.code, status.details, status.trailing_metadata)

    async def send_initial_metadata(self, initial_metadata: Any) -> None:
        self._context.send_initial_metadata(tuple(initial_metadata))

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}  # no transport security in-process

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def time_remaining(self) -> float | None:
        remaining: float | None = self._context.time_remaining()
        return remaining

    def done(self) -> bool:
        return not self._context.is_active()

    def cancelled(self) -> bool:
        return not self._context.is_active()

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code
        self._context.set_code(code)

    def set_details(self, details: str) -> None:
        self._context.set_details(details)

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self._context.set_trailing_metadata(tuple(trailing_metadata))

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._context.add_callback(lambda: callback(self))


class _Facade:
    """One service's guarded handlers as the synchronous methods ``grpc_testing`` calls."""

    def __init__(
        self, handlers: Mapping[str, grpc.RpcMethodHandler], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._handlers = handlers
        self._loop = loop

    def __getattr__(self, name: str) -> Callable[[Any, Any], Any]:
        handler = self._handlers[name]
        loop = self._loop
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            def call(request: Any, context: Any) -> Any:
                future = asyncio.run_coroutine_threadsafe(unary(request, AioContext(context)), loop)
                context.add_callback(future.cancel)  # a cancelled call cancels the task
                try:
                    return future.result()
                except grpc.aio.AbortError:
                    return None  # completed with the code, details and trailers set

            return call
        if handler.unary_stream is not None:
            stream = handler.unary_stream

            def call_stream(request: Any, context: Any) -> Iterator[Any]:
                return _iterate(stream(request, AioContext(context)), context, loop)

            return call_stream
        if handler.stream_stream is not None:
            bidi = handler.stream_stream

            def call_bidi(requests: Iterator[Any], context: Any) -> Iterator[Any]:
                return _iterate(bidi(_requests(requests), AioContext(context)), context, loop)

            return call_bidi
        raise NotImplementedError(f"{name}: client-streaming-only methods are not served")


async def _next(responses: AsyncIterator[Any]) -> Any:
    return await anext(responses)


async def _requests(requests: Iterator[Any]) -> AsyncIterator[Any]:
    """grpc_testing's (blocking) request iterator as the async one grpc.aio hands over."""
    end = object()
    while (request := await asyncio.to_thread(next, requests, end)) is not end:
        yield request


def _iterate(
    responses: AsyncIterator[Any], context: Any, loop: asyncio.AbstractEventLoop
) -> Iterator[Any]:
    """An async generator's items, each awaited on ``loop``; the call's end cancels the
    one being awaited, and the generator is closed on the loop (its cleanup runs)."""
    pending: list[concurrent.futures.Future[Any]] = []
    context.add_callback(lambda: [f.cancel() for f in pending])
    try:
        while True:
            future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
                _next(responses), loop
            )
            pending[:] = [future]
            try:
                yield future.result()
            except (StopAsyncIteration, grpc.aio.AbortError, concurrent.futures.CancelledError):
                return  # ended, aborted (its code set), or cancelled by the call's end
    finally:
        aclose = getattr(responses, "aclose", None)
        if aclose is not None:
            asyncio.run_coroutine_threadsafe(aclose(), loop).result()


def in_process_server(gateway: Gateway, loop: asyncio.AbstractEventLoop) -> Any:
    """A ``grpc_testing`` server of the gateway's four services, guarded as served."""
    facades = {
        SERVICES[service]: _Facade(handlers, loop)
        for service, handlers in gateway.guard().guarded(gateway.registrations()).items()
    }
    return grpc_testing.server_from_dictionary(facades, grpc_testing.strict_real_time())


def method(service: str, name: str) -> pb_descriptor.MethodDescriptor:
    """The descriptor of ``service``'s (short name, e.g. ``QueueService``) method."""
    return SERVICES[f"busmq.v1.{service}"].methods_by_name[name]


class Outcome:
    """How a call ended: its response (unary) or responses (stream), code, details,
    trailing metadata, and the ``google.rpc.Status`` details they carry."""

    def __init__(
        self,
        responses: list[Any],
        trailing_metadata: Any,
        code: grpc.StatusCode,
        details: str,
    ) -> None:
        self.responses = responses
        self.trailing_metadata = tuple(trailing_metadata or ())
        self.code = code
        self.details = details

    @property
    def response(self) -> Any:
        assert len(self.responses) == 1, self.responses
        return self.responses[0]

    def reason(self) -> tuple[str, dict[str, str]]:
        """The ``google.rpc.ErrorInfo`` reason and metadata (``("", {})`` if none)."""
        from google.rpc import error_details_pb2

        status = self.status()
        if status is None:
            return "", {}
        info = error_details_pb2.ErrorInfo()
        for detail in status.details:
            if detail.Is(info.DESCRIPTOR):
                detail.Unpack(info)
                return info.reason, dict(info.metadata)
        return "", {}

    def status(self) -> Any:
        """The ``google.rpc.Status`` of the trailing metadata, if the call sent one."""
        for key, value in self.trailing_metadata:
            if key == "grpc-status-details-bin":
                from google.rpc import status_pb2

                return status_pb2.Status.FromString(value)
        return None


async def outcome(rpc: Any) -> Outcome:
    """Wait (in a thread: the loop meanwhile runs the servicer) for a call to end."""

    def wait() -> Outcome:
        if hasattr(rpc, "take_response"):  # a server stream
            responses: list[Any] = []
            while True:
                try:
                    responses.append(rpc.take_response())
                except Exception:  # grpc_testing raises once the stream has ended
                    break
            trailing, code, details = rpc.termination()
            return Outcome(responses, trailing, code, details)
        response, trailing, code, details = rpc.termination()
        return Outcome([] if response is None else [response], trailing, code, details)

    return await asyncio.to_thread(wait)


__all__ = ["AioContext", "Outcome", "in_process_server", "method", "outcome"]
