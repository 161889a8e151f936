"""``PushStream``: pushes over one long-lived bidirectional stream.

A unary call costs grpc.aio about three times a stream message's CPU on each side (see
``docs/design.md``, "The gateway at 1,000 msg/s"), so producers of many small pushes
keep one stream open instead. Each request is one push, stored as ``Push`` stores it,
and answered by its ``sequence``:

* **Order.** A queue's pushes are stored one after the other, in the order read (a *lane*
  per queue, a task only while it has pushes); different queues' pushes run side by side,
  so that the shard connections pipeline them. Outcomes are written as they come.
* **Bounds.** At most ``max_in_flight`` pushes are read and their answers not yet taken
  by grpc; beyond that no request is read, so HTTP/2 flow control holds back a client
  that writes faster than it is answered, or reads no answers.
* **Batching of answers.** Outcomes that complete while a response is being written go
  together in the next one.
* **The drain.** A draining gateway reads no further request, answers every push it read,
  and ends the stream ``UNAVAILABLE`` (``DRAINING``): a push without an answer then was
  not stored.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from busmq import PushResult
from busmq.eager import start_eagerly
from busmq.v1 import queue_service_pb2 as pb

from .access import Refused
from .errors import RequestError, error_status, failure_status

MAX_IN_FLIGHT = 1000

Push = Callable[[pb.PushRequest], Awaitable[PushResult]]


async def push_outcome(push: Push, request: pb.PushRequest, method: str) -> dict[str, Any]:
    """One push stored, as the fields of its outcome (a ``PushOutcome`` of ``PushMany``
    or a ``PushStreamOutcome``): ``result``, or the ``error`` status ``Push`` would have
    ended with."""
    try:
        result = await push(request)
    except Exception as exc:
        return {"error": failure_status(exc, method)}
    return {"result": {"ids": result.ids, "duplicate": result.duplicate}}


class Draining(RequestError):
    def __init__(self) -> None:
        super().__init__(
            "the gateway is draining: every push read was answered; reconnect to push more",
            "DRAINING",
            grpc.StatusCode.UNAVAILABLE,
        )


class PushStreamSession:
    """One ``PushStream`` call: reads requests, pushes them through lanes, and yields
    the responses (:meth:`responses`)."""

    def __init__(
        self, push: Push, draining: asyncio.Event, max_in_flight: int = MAX_IN_FLIGHT
    ) -> None:
        self._push = push
        self._draining = draining
        self._room = asyncio.Semaphore(max_in_flight)
        self._lanes: dict[str, collections.deque[pb.PushStreamRequest]] = {}
        self._lane_tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._ready: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._reading = True
        self._error: BaseException | None = None

    async def responses(self, requests: AsyncIterator[Any]) -> AsyncIterator[pb.PushStreamResponse]:
        """The responses to ``requests``, until the client ends its side and every push
        is answered. Raises :class:`Draining` when the gateway drains, and what reading
        the requests raised (a malformed request: :class:`RequestError`)."""
        reader = asyncio.create_task(self._read(requests), name="busmq-push-stream-reader")
        drain = asyncio.create_task(self._draining.wait())
        drain.add_done_callback(lambda _: reader.cancel())
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._ready:
                    outcomes, self._ready = self._ready, []
                    yield pb.PushStreamResponse(outcomes=outcomes)
                    # Slots come back once grpc took the response: a client that reads
                    # no answers holds at most max_in_flight of them here.
                    for _ in outcomes:
                        self._room.release()
                if not self._reading and not self._in_flight and not self._ready:
                    break
            if self._error is not None:
                raise self._error
            if reader.cancelled() or self._draining.is_set():
                raise Draining()
        finally:
            drain.cancel()
            reader.cancel()
            for task in tuple(self._lane_tasks):
                task.cancel()
            await asyncio.gather(reader, drain, *self._lane_tasks, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        """Read requests into lanes while there is room. Cancelled by the drain: the
        room is taken before a request is read, so a cancel never drops one."""
        try:
            iterator = aiter(requests)
            while True:
                await self._room.acquire()
                try:
                    request = await anext(iterator)
                except StopAsyncIteration:
                    self._room.release()
                    return
                except BaseException:
                    self._room.release()
                    raise
                self._in_flight += 1
                if isinstance(request, Refused):
                    self._answer(request.request.sequence, {"error": error_status(request.error)})
                else:
                    self._enqueue(request)
        except asyncio.CancelledError:
            pass  # the drain, or the call ended
        except Exception as exc:
            self._error = exc
        finally:
            self._reading = False
            self._wake.set()

    def _enqueue(self, request: pb.PushStreamRequest) -> None:
        queue = request.push.queue
        lane = self._lanes.get(queue)
        if lane is not None:
            lane.append(request)
            return
        self._lanes[queue] = collections.deque((request,))
        task = start_eagerly(self._run_lane(queue))
        self._lane_tasks.add(task)
        task.add_done_callback(self._lane_tasks.discard)

    async def _run_lane(self, queue: str) -> None:
        """Push a queue's requests one after the other until its lane is empty."""
        lane = self._lanes[queue]
        try:
            while lane:
                request = lane[0]
                outcome = await push_outcome(self._push, request.push, "PushStream")
                lane.popleft()
                self._answer(request.sequence, outcome)
        finally:
            del self._lanes[queue]

    def _answer(self, sequence: int, outcome: dict[str, Any]) -> None:
        outcome["sequence"] = sequence
        self._ready.append(outcome)
        self._in_flight -= 1
        self._wake.set()
