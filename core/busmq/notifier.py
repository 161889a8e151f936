"""Wake-ups for idle consumers: one pub/sub connection per shard instead of one blocking
read per consumer.

Every push publishes the queue's last id on ``busmq:{name}:n``. A consumer reads without
blocking; when it finds nothing it waits on an in-process event that this notifier sets
when a message for its queue is published, or until ``block_seconds`` pass (so a lost
notification, e.g. during a reconnect, delays a delivery but never loses it). A process
therefore holds O(1) Redis connections per shard however many consumers it runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import redis.asyncio as aioredis

from .keys import QueueKeys

log = logging.getLogger(__name__)

_CONNECTION_ERRORS = (ConnectionError, OSError, TimeoutError)


class Notifier:
    """Pub/sub subscriptions of one shard, shared by every local consumer."""

    def __init__(self, client: aioredis.Redis, retry_max: float) -> None:
        self._client = client
        self._retry_max = retry_max
        self._pubsub: aioredis.client.PubSub | None = None
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._listener: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def watch(self, queue: str) -> asyncio.Event:
        """An event set whenever ``queue`` gets messages (clear it before each read)."""
        channel = QueueKeys(queue).notify_channel
        event = asyncio.Event()
        async with self._lock:
            first = not self._waiters[channel]
            self._waiters[channel].add(event)
            if first:
                await self._subscribe(channel)
        return event

    async def unwatch(self, queue: str, event: asyncio.Event) -> None:
        channel = QueueKeys(queue).notify_channel
        async with self._lock:
            waiters = self._waiters.get(channel)
            if waiters is None:
                return
            waiters.discard(event)
            if not waiters:
                del self._waiters[channel]
                if self._pubsub is not None:
                    try:
                        await self._pubsub.unsubscribe(channel)
                    except Exception as exc:  # the listener will reconnect and resubscribe
                        log.debug("unsubscribe %s failed: %s", channel, exc)

    async def _subscribe(self, channel: str) -> None:
        if self._pubsub is None:
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            await self._pubsub.subscribe(channel)
        except Exception as exc:  # consumers fall back to their timeout meanwhile
            log.debug("subscribe %s failed: %s", channel, exc)
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name="busmq-notifier")

    async def _listen(self) -> None:
        backoff = 0.05
        while self._waiters:
            pubsub = self._pubsub
            try:
                if pubsub is None or not pubsub.subscribed:
                    await self._resubscribe()
                    continue
                message = await pubsub.get_message(timeout=1.0)
                backoff = 0.05
            except Exception as exc:
                log.debug("notifier connection lost: %s", exc)
                await self._reset()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._retry_max)
                continue
            if message is None or message.get("type") != "message":
                continue
            channel = message["channel"]
            name = channel.decode() if isinstance(channel, bytes) else channel
            for event in self._waiters.get(name, ()):
                event.set()

    async def _resubscribe(self) -> None:
        async with self._lock:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            if self._waiters:
                await self._pubsub.subscribe(*self._waiters)
        # Wake everyone: messages published while unsubscribed were not announced.
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def _reset(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except Exception as exc:
                log.debug("closing pub/sub connection: %s", exc)

    async def close(self) -> None:
        self._waiters.clear()
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        await self._reset()
