"""The operator's half of ``busmq.v1.QueueService``: ``ListQueues`` and ``BrowseQueue``
(read-only views of what the bus holds, for the admin CLI and tools)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

import grpc

from busmq import Bus, QueueNotFoundError, inventory
from busmq.inventory import QueueStats
from busmq.message import Message
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import types_pb2

from .access import CURRENT
from .config import GatewaySettings
from .controls import rate_limit_proto
from .convert import duration, message_fields
from .errors import RequestError, rpc_errors, unary
from .principals import Kind
from .streaming import Beat, StreamCount, paced

DEFAULT_PAGE = 1000
MAX_PAGE = 10_000


class QueueInventory:
    """``ListQueues`` and ``BrowseQueue``, mixed into the QueueService servicer."""

    _bus: Bus
    _settings: GatewaySettings
    _draining: asyncio.Event
    browses: StreamCount

    @unary
    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListQueuesResponse:
        if request.page_size > MAX_PAGE:
            raise RequestError(f"page_size must be at most {MAX_PAGE}")
        caller = CURRENT.get(None)  # the queues the caller holds a verb on
        page = await inventory.list_stats(
            self._bus.shards,
            prefix=request.prefix,
            after=request.page_token,
            limit=request.page_size or DEFAULT_PAGE,
            include=None if caller is None else functools.partial(caller.may, Kind.QUEUE, None),
        )
        return pb.ListQueuesResponse(
            queues=[summary(stats) for stats in page.queues],
            next_page_token=page.next_after or "",
            total=page.total,
        )

    async def BrowseQueue(
        self, request: pb.BrowseQueueRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BrowseQueueResponse]:
        pages: AsyncIterator[list[Message]] | None = None
        async with rpc_errors(context, "BrowseQueue"):
            if request.to_id and request.to_id < request.from_id:
                raise RequestError("to_id must not be below from_id")
            if request.follow and request.to_id:
                raise RequestError("follow reads on without an end: give no to_id")
            queue = self._bus.queue(request.queue)
            if not await queue.exists():
                raise QueueNotFoundError(request.queue)
            pages = inventory.browse_pages(
                queue.store, request.from_id, request.to_id or None, follow=request.follow
            )
        if pages is None:  # pragma: no cover - rpc_errors aborted the call
            return
        with self.browses.open():
            beats = paced(pages, self._draining, self._settings.heartbeat_seconds)
            async with rpc_errors(context, "BrowseQueue"):
                async for item in beats:
                    if item is Beat.HEARTBEAT:
                        yield pb.BrowseQueueResponse(heartbeat=types_pb2.Heartbeat())
                    elif item is Beat.DRAINING:
                        state = types_pb2.StateEvent(kind="draining", source=request.queue)
                        yield pb.BrowseQueueResponse(state=state)
                    else:
                        batch = pb.MessageBatch(messages=[message_fields(m) for m in item])
                        yield pb.BrowseQueueResponse(messages=batch)


def summary(stats: QueueStats) -> pb.QueueSummary:
    return pb.QueueSummary(
        queue=stats.name,
        shard=stats.shard,
        count=stats.messages,
        ready=stats.ready,
        pending=stats.pending,
        oldest_pending=duration(stats.oldest_pending_seconds),
        consumers=stats.consumers,
        attachments=stats.attachments,
        delayed=stats.delayed,
        dead_letters=stats.dead_letters,
        last_id=stats.last_id,
        delivered=stats.delivered,
        mode=stats.mode or "",
        paused=stats.paused,
        ttl=duration(stats.ttl),
        rate_limit=rate_limit_proto(stats.rate_limit),
        key_rate_limit=rate_limit_proto(stats.key_rate_limit),
        ordering_key=stats.ordering or "",
        ordered_keys_in_flight=stats.ordered_keys_in_flight,
        ordered_waiting=stats.ordered_waiting,
    )
