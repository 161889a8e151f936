"""Forwards the outbox rows of one gateway, in order, whenever the link is usable.

Each round reads the oldest rows of the target and sends them with their stored
``request_id``: the rows of one queue as one ``PushMany`` (within the bounds of a call)
in which the gateway stores them one after the other and stops at the first it does not
store (``stop_queue_at_failure``), so a queue's order is kept at one round trip per call
rather than per row; different queues concurrently; one ``Push`` per row if the gateway
lacks ``PushMany``. Rows are deleted once stored. A retry after an
ambiguous failure (the call failed, but the gateway may have stored the push) is
recognised by the gateway from the ``request_id`` within its dedupe window
(``BusSettings.dedupe_seconds`` on the gateway, 600 s by default) and stored once.

Outcomes per row:
* stored (or a duplicate of a stored push): deleted;
* ``UNAVAILABLE`` / ``DEADLINE_EXCEEDED`` / ``UNAUTHENTICATED``: the link is told, the
  queue's remaining rows wait for the link to be usable again;
* ``RESOURCE_EXHAUSTED`` (queue full) or ``CANCELLED`` (by the gateway or a proxy):
  retried after a backoff, still in order;
* ``NOT_FOUND``: if this bus holds an attachment to the queue it is re-attached (the
  queue expired during the outage) and the row retried; otherwise, like any other
  permanent refusal (invalid message, ...), the row moves to the dead letters and an
  ``error`` event (details ``queue``, ``seq``, ``dead_letter``) is emitted on the link.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable

import grpc
from google.rpc import status_pb2

from ..events import Event
from ..v1 import queue_service_pb2 as pb
from .backoff import Backoff
from .errors import (
    RETRYABLE,
    UNAUTHORIZED,
    error_reason,
    from_rpc_error,
    from_status,
    status_code,
    status_info,
)
from .link import Link, LinkState
from .outbox import Outbox, OutboxRow
from .pushes import MAX_BYTES, MAX_MESSAGES, MAX_PUSHES

log = logging.getLogger(__name__)


class _Outcome(enum.Enum):
    STORED = "stored"
    DUPLICATE = "duplicate"  # stored by an earlier attempt
    LINK_DOWN = "link_down"
    RETRY = "retry"
    DEAD = "dead"


class Forwarder:
    """The forwarding task of one link (see the module docstring)."""

    def __init__(
        self,
        link: Link,
        outbox: Outbox,
        *,
        batch_rows: int,
        on_stored: Callable[[str, int], None],
        reattach: Callable[[str], Awaitable[bool]],
    ) -> None:
        self.link = link
        self.outbox = outbox
        self.batch_rows = batch_rows
        self.forwarded = 0
        """Messages forwarded from the outbox so far."""
        self._on_stored = on_stored
        self._reattach = reattach
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"busmq-forwarder {self.link.url}")

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        settings = self.link.settings
        backoff = Backoff(settings.reconnect_backoff_initial, settings.reconnect_backoff_max)
        target = self.link.url
        while True:
            self._wake.clear()
            if not self.outbox.rows(target):
                self.link.note_outbox()
                await self._wake.wait()
                continue
            if not await self.link.wait_usable():
                if self.link.state is LinkState.CLOSED:
                    return
                continue
            try:
                rows = await self.outbox.head(target, self.batch_rows)
                if not rows:  # counted, not yet committed: the commit wakes us
                    await self._wake.wait()
                    continue
                outcome = await self._round(rows)
            except Exception as exc:  # a disk error: report, retry later
                log.exception("forwarding the outbox to %s failed", target)
                self.link.events.emit(Event("error", target, error=exc))
                outcome = _Outcome.RETRY
            self.link.note_outbox()
            if outcome is _Outcome.RETRY:
                await asyncio.sleep(backoff.next())
            elif outcome is _Outcome.LINK_DOWN:
                await asyncio.sleep(0)  # the link's supervisor takes it from here
            else:
                backoff.reset()

    async def _round(self, rows: list[OutboxRow]) -> _Outcome:
        """Send one batch of rows; STORED if all went, else why some did not."""
        by_queue: dict[str, list[OutboxRow]] = {}
        for row in rows:
            by_queue.setdefault(row.queue, []).append(row)
        results = await asyncio.gather(*(self._send_queue(q) for q in by_queue.values()))
        stored = [(row, fresh) for done, _ in results for row, fresh in done]
        await self.outbox.remove(row for row, _ in stored)
        for row, fresh in stored:
            self.forwarded += row.count
            if fresh:
                self._on_stored(row.queue, row.count)
        outcomes = {outcome for _, outcome in results}
        for outcome in (_Outcome.LINK_DOWN, _Outcome.RETRY):
            if outcome in outcomes:
                return outcome
        return _Outcome.STORED

    async def _send_queue(
        self, rows: list[OutboxRow]
    ) -> tuple[list[tuple[OutboxRow, bool]], _Outcome]:
        """The rows of one queue, in order: as few ``PushMany`` calls as the bounds of a
        call allow (one ``Push`` per row if the gateway lacks it), stopping at the first
        row that must wait (a dead row is moved aside and the next ones go on)."""
        stored: list[tuple[OutboxRow, bool]] = []
        index = 0
        while index < len(rows):
            outcomes = await self._send_rows(_chunk(rows, index, self.link.pushes.push_many))
            for row, outcome in zip(rows[index:], outcomes, strict=False):
                if outcome in (_Outcome.STORED, _Outcome.DUPLICATE):
                    stored.append((row, outcome is _Outcome.STORED))
                elif outcome is not _Outcome.DEAD:
                    return stored, outcome
            index += len(outcomes)
        return stored, _Outcome.STORED

    async def _send_rows(self, rows: list[OutboxRow]) -> list[_Outcome]:
        """Send rows of one queue; the outcomes of the first rows, in order, up to and
        including the first that is not stored (the gateway did not attempt the rest)."""
        link = self.link
        if link.state is LinkState.CLOSED or not link.usable:
            return [_Outcome.LINK_DOWN]
        if len(rows) == 1:
            return [await self._send(rows[0])]
        request = pb.PushManyRequest(
            pushes=[pb.PushRequest.FromString(row.messages) for row in rows],
            stop_queue_at_failure=True,
        )
        try:
            response = await link.stub().PushMany(
                request, metadata=link.metadata, timeout=link.operation_timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                link.pushes.lacks_push_many()
                return [await self._send(rows[0])]
            if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(exc) == "":
                return [await self._send(rows[0])]  # too large together for the gateway
            return [await self._refused(rows[0], exc.code(), error_reason(exc), exc)]
        outcomes: list[_Outcome] = []
        for row, outcome in zip(rows, response.outcomes, strict=False):
            if outcome.WhichOneof("outcome") == "result":
                outcomes.append(_Outcome.DUPLICATE if outcome.result.duplicate else _Outcome.STORED)
                continue
            reason = status_info(outcome.error)[0]
            if reason == "NOT_ATTEMPTED":
                break
            outcomes.append(
                await self._refused(row, status_code(outcome.error), reason, outcome.error)
            )
            if outcomes[-1] is not _Outcome.DEAD:
                break
        return outcomes or [_Outcome.RETRY]

    async def _send(self, row: OutboxRow) -> _Outcome:
        link = self.link
        try:
            response = await link.stub().Push(
                pb.PushRequest.FromString(row.messages),
                metadata=link.metadata,
                timeout=link.operation_timeout,
            )
        except grpc.aio.AioRpcError as exc:
            return await self._refused(row, exc.code(), error_reason(exc), exc)
        return _Outcome.DUPLICATE if response.duplicate else _Outcome.STORED

    async def _refused(
        self,
        row: OutboxRow,
        code: grpc.StatusCode,
        reason: str,
        failure: grpc.aio.AioRpcError | status_pb2.Status,
    ) -> _Outcome:
        """What to do with a row the gateway did not store: the failure of its call,
        or its status in a ``PushMany``."""
        if code in RETRYABLE or code in UNAUTHORIZED:
            self.link.report_code(code)
            return _Outcome.LINK_DOWN
        if code is grpc.StatusCode.CANCELLED or (
            code is grpc.StatusCode.RESOURCE_EXHAUSTED and reason == "QUEUE_FULL"
        ):
            return _Outcome.RETRY
        if code is grpc.StatusCode.NOT_FOUND and await self._reattach(row.queue):
            return _Outcome.RETRY
        target = self.link.url
        if isinstance(failure, grpc.aio.AioRpcError):
            error = from_rpc_error(failure, queue=row.queue, target=target)
        else:
            error = from_status(failure, queue=row.queue, target=target)
        log.error("outbox push #%d to %s refused for good: %s", row.seq, row.queue, error)
        await self.outbox.dead_letter(row, str(error))
        details = {"queue": row.queue, "seq": row.seq, "dead_letter": True}
        self.link.events.emit(Event("error", row.queue, error=error, details=details))
        return _Outcome.DEAD


def _chunk(rows: list[OutboxRow], start: int, many: bool) -> list[OutboxRow]:
    """The rows from ``start`` that fit in one call: one without ``PushMany``, else
    within the bounds of the link's coalesced pushes."""
    chunk = [rows[start]]
    if not many:
        return chunk
    size, messages = len(rows[start].messages), rows[start].count
    for row in rows[start + 1 :]:
        size += len(row.messages)
        messages += row.count
        if len(chunk) >= MAX_PUSHES or size > MAX_BYTES or messages > MAX_MESSAGES:
            break
        chunk.append(row)
    return chunk
