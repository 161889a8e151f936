"""Sending the reply to a request served through the gateway: ``Reply`` calls.

A unary answer is one ``Reply``; a streamed one is sent as chunks, the items produced
while a ``Reply`` is in flight going together in the next one (bounded in items and
bytes), the last one marked ``end``. A handler's failure is a ``ReplyError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from ..errors import BusError, InvalidMessageError
from ..service_api import NotAwaited, ReplyFailed
from ..v1 import request_service_pb2 as pb
from .convert import value_to_payload
from .errors import error_reason
from .link import Link
from .streams import RESUMABLE

_MAX_CHUNK_ITEMS = 500
_MAX_CHUNK_BYTES = 1024 * 1024  # a soft bound: one item alone may be larger
# Statuses of a Reply that did not get through (as opposed to a refusal of its content).
IN_TRANSIT = RESUMABLE  # includes refused credentials: the link re-probes


class Reply:
    """Sends the ``Reply`` calls answering one served request (a
    :class:`~busmq.service_api.ReplySink`). ``NotAwaited`` means the gateway no longer
    awaits the reply: its stream ended (the request was given back) or the requester
    gave up. A reply that failed in transit calls ``on_failed``, which reopens the
    stream so that the gateway gives the request back."""

    def __init__(
        self,
        link: Link,
        stub: Callable[[], Any],
        mapped: Callable[[grpc.aio.AioRpcError], BusError],
        request_id: str,
        on_failed: Callable[[], None],
    ) -> None:
        self.link = link
        self.request_id = request_id
        self._stub = stub
        self._mapped = mapped
        self._on_failed = on_failed

    async def stream(self, items: AsyncIterator[Any]) -> None:
        await send_stream(items, self)

    async def finish(self, replied: bool) -> None:
        if not replied:
            self._on_failed()

    async def give_back(self) -> None:
        pass  # the gateway gives it back when the stream closes

    async def value(self, value: Any) -> None:
        payload, kind = value_to_payload(value)
        reply = pb.ReplyPayload(payload=payload, kind=kind)
        await self._send(pb.ReplyRequest(request_id=self.request_id, value=reply))

    async def chunks(self, items: list[pb.ReplyPayload], end: bool) -> None:
        chunks = pb.ReplyChunks(items=items, end=end)
        await self._send(pb.ReplyRequest(request_id=self.request_id, chunks=chunks))

    async def error(self, error_type: str, message: str) -> None:
        error = pb.ReplyError(type=error_type, message=message)
        await self._send(pb.ReplyRequest(request_id=self.request_id, error=error))

    async def _send(self, request: pb.ReplyRequest) -> None:
        link = self.link
        try:
            await self._stub().Reply(
                request, metadata=link.metadata, timeout=link.operation_timeout, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as exc:
            link.report(exc)
            code = exc.code()
            if code is grpc.StatusCode.NOT_FOUND and error_reason(exc) == "REQUEST_NOT_FOUND":
                raise NotAwaited from None
            error = self._mapped(exc)
            if code in IN_TRANSIT:
                raise ReplyFailed(error) from None
            raise error from None  # a refusal of the content: the handler's outcome


async def send_stream(items: AsyncIterator[Any], reply: Reply) -> None:
    """Send a streamed reply: the items produced while a Reply is in flight go together
    in the next one. The iterator runs in a task of its own (so that it is always
    resumed in the same task) and is closed when the reply ends or fails."""
    buffer: asyncio.Queue[Any] = asyncio.Queue(_MAX_CHUNK_ITEMS)
    producer = asyncio.create_task(_produce(items, buffer), name="busmq-federated-reply")
    try:
        while True:
            batch, failure = await _next_batch(buffer, producer)
            end = failure is None and producer.done() and buffer.empty()
            if batch or end:
                await reply.chunks(batch, end)
            if failure is not None:
                raise failure
            if end:
                return
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)


async def _produce(items: AsyncIterator[Any], buffer: asyncio.Queue[Any]) -> None:
    try:
        async for item in items:
            await buffer.put(item)
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


async def _next_batch(
    buffer: asyncio.Queue[Any], producer: asyncio.Task[None]
) -> tuple[list[pb.ReplyPayload], BaseException | None]:
    """The items ready (waiting for one if none is), encoded, within the batch bounds;
    and the handler's failure once everything before it was taken."""
    taken: list[Any] = []
    if buffer.empty() and not producer.done():
        getter = asyncio.ensure_future(buffer.get())
        try:
            await asyncio.wait({getter, producer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            taken.append(getter.result())
    batch: list[pb.ReplyPayload] = []
    size = 0
    while taken or not buffer.empty():
        value = taken.pop() if taken else buffer.get_nowait()
        try:
            payload, kind = value_to_payload(value)
        except InvalidMessageError as exc:
            return batch, exc  # a value the handler should not have produced
        batch.append(pb.ReplyPayload(payload=payload, kind=kind))
        size += len(payload)
        if len(batch) >= _MAX_CHUNK_ITEMS or size >= _MAX_CHUNK_BYTES:
            return batch, None
    if not producer.done():
        return batch, None
    if producer.cancelled():
        return batch, RuntimeError("the streamed reply was cancelled")
    return batch, producer.exception()
