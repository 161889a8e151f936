"""Wake-ups for idle consumers: one pub/sub connection per shard instead of one blocking
read per consumer.

Every push publishes the queue's last id on ``busmq:{name}:n``. A consumer reads without
blocking; when it finds nothing it waits on an in-process event that this notifier sets
when a message for its queue is published. A process therefore holds O(1) Redis
connections per shard however many consumers it runs.

The subscription speaks RESP itself (an ``asyncio.Protocol`` with a hiredis reader, see
:mod:`busmq.mux`) and sets the consumers' events right where it parses a publication:
no redis-py ``PubSub``, no polling task. A tick every ``block_seconds`` also wakes every
watcher that no publication woke since the last tick (a busy process's consumers are not
all woken at once for nothing), so a lost notification (pub/sub is fire-and-forget)
delays a delivery by at most two ticks and never loses it, and idle consumers need no
timer of their own. After a
reconnect the notifier subscribes again and wakes every watcher, since publications made
while it was away were not seen.

A publication of ``c`` (rather than an id) says the queue's processing controls or its
schedule changed (a pause, a rate limit, a delayed push, a retry): it also marks the
consumers' :class:`WakeUp` events ``recheck``, so each makes its next read the full one
that applies controls (see :mod:`busmq.consumer`). A resubscription marks them too,
since a publication may have been missed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Iterable
from typing import Any, Protocol

import redis.exceptions as rex

from .keys import QueueKeys
from .mux import Endpoint, RespProtocol

log = logging.getLogger(__name__)

RECHECKS = (b"c", b"0")
"""Payloads published when a queue's controls or schedule changed (``0`` by earlier
versions, whose pushes never publish it)."""


PAUSED = b"p"
"""Published after ``c`` when a queue was paused (see :attr:`WakeUp.give_backs`)."""


COVER_SECONDS = 1.0
"""How long after a plain read a publication of an id it received is taken for the late
announcement of that message (:meth:`WakeUp.publication`). A read nudged by a push of
this process goes out with the push, so the push's announcement comes back around the
read's reply, often after it; later than this, an id that low means the queue's ids
started again (it was destroyed and created anew), and it wakes the consumer."""

ALWAYS_SERVING = asyncio.Event()
ALWAYS_SERVING.set()  # no loop is bound: waiting on a set event returns at once


class WakeUp(asyncio.Event):
    """A consumer's wake-up; ``recheck`` is set with it when the queue's controls or
    schedule may have changed (the consumer clears it before a full read)."""

    recheck = True
    woken = False
    """Set by a publication since the last tick (see :meth:`Notifier._on_tick`)."""
    give_backs = 0
    """How many times the consumer was told to give back what it fetched and has not
    handed out (at-least-once): the queue was paused, or its shard's master moved (a
    promoted replica may not have seen the reads and acks that fetched it)."""
    serving: asyncio.Event = ALWAYS_SERVING
    """Clear while the queue's shard is offline (the shard's own event, once a local
    reader watches): an at-least-once consumer hands nothing out meanwhile, since the
    probe that brings the shard back says first whether the master moved."""
    published = 0
    """The highest id published since the last :meth:`clear` (0: none)."""
    news = False
    """Set since the last :meth:`clear` by something other than an id publication (a
    tick, a change of controls, a give-back, a :meth:`Notifier.nudge`)."""
    covered = 0
    """The last message id the consumer's last plain read received (0: none, or not
    known): every message up to it was read by the group, so a publication of it or
    of an earlier one is no news (see :meth:`cover`). Reset when a publication may have
    been missed or the queue's master changed (:func:`mark_recheck`)."""
    covered_until = 0.0
    nudgeable = False
    """The consumer waits for a wake-up and its next read is a plain ``XREADGROUP``
    (see :meth:`Notifier.nudge`)."""

    def set(self) -> None:
        self.news = True
        super().set()

    def clear(self) -> None:
        self.published = 0
        self.news = False
        super().clear()

    def cover(self, last_id: int) -> None:
        """The consumer's plain read just received messages up to ``last_id`` (0: none)."""
        self.covered = last_id
        self.covered_until = time.monotonic() + COVER_SECONDS

    def publication(self, last_id: int) -> None:
        """A push stored messages up to ``last_id``."""
        self.woken = True  # see Notifier._on_tick
        if last_id <= self.covered and time.monotonic() < self.covered_until:
            return  # the announcement of a push that a read took already (see cover)
        if last_id > self.published:
            self.published = last_id
        asyncio.Event.set(self)

    def stale(self) -> bool:
        """Whether every wake-up since the last :meth:`clear` was a publication of an id
        at most :attr:`covered`: the read that received it has seen those messages."""
        return self.is_set() and not self.news and self.published <= self.covered


def mark_give_back(events: Iterable[asyncio.Event]) -> None:
    """Wake ``events``, telling the consumers' among them to give back their read-ahead."""
    for event in events:
        if type(event) is WakeUp:
            event.give_backs += 1
            event.recheck = True  # a control changed: no lean read until a full one
            event.covered = 0
        event.set()


def mark_recheck(events: set[asyncio.Event]) -> None:
    """Wake ``events``, marking the consumers' among them ``recheck``."""
    for event in events:
        if type(event) is WakeUp:
            event.recheck = True
            event.covered = 0
        event.set()


class WakeUps(Protocol):
    """What consumers need from a shard's wake-ups (a :class:`Notifier`, or one per
    node of a cluster)."""

    tick: float

    async def watch(self, queue: str) -> WakeUp: ...

    async def unwatch(self, queue: str, event: asyncio.Event) -> None: ...

    def nudge(self, channel: bytes) -> None: ...

    async def close(self) -> None: ...


class _Subscription(RespProtocol):
    """The notifier's connection: replies to the handshake, then publications."""

    def __init__(self, notifier: Notifier, label: str, timeout: float) -> None:
        super().__init__(label, timeout)
        self._waiters = notifier._waiters
        self._sharded = notifier.sharded
        self._confirmations: dict[bytes, list[asyncio.Future[None]]] = {}
        # Sharded: one SSUBSCRIBE per channel, each answered (or refused) in order.
        self._in_order: collections.deque[asyncio.Future[None]] = collections.deque()

    def subscribe(self, channels: list[bytes]) -> asyncio.Future[Any]:
        """Subscribe; the future is done when Redis confirmed every channel, or when
        the connection ended (see :attr:`error`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self.error is not None:
            future.set_result(None)
            return future
        if self._sharded:  # a sharded SSUBSCRIBE takes the channels of one slot only
            futures = []
            for channel in channels:
                self.write((b"SSUBSCRIBE", channel))
                futures.append(loop.create_future())
                self._in_order.append(futures[-1])
            return asyncio.gather(*futures)
        self.write((b"SUBSCRIBE", *channels))
        # Redis confirms the channels in order: the last confirmation covers them all.
        self._confirmations.setdefault(channels[-1], []).append(future)
        return future

    def push_received(self, reply: Any) -> None:
        if self._sharded and isinstance(reply, rex.ResponseError):
            # A channel whose slot is served elsewhere (MOVED): not subscribed here;
            # the cluster notifier moves it once it knows the slot's new node.
            log.debug("%s: sharded subscription refused: %s", self.label, reply)
            _resolve(self._in_order.popleft() if self._in_order else None)
            return
        if type(reply) is not list or len(reply) != 3:
            super().push_received(reply)  # an error or garbage: reconnect
            return
        kind, channel, payload = reply
        if kind in (b"message", b"smessage"):
            self._published(channel, payload)
        elif kind == b"subscribe":
            for future in self._confirmations.pop(channel, ()):
                _resolve(future)
        elif kind == b"ssubscribe":
            _resolve(self._in_order.popleft() if self._in_order else None)
        elif kind == b"sunsubscribe":
            # Unasked while watched: the slot moved away. Read once (the tick and the
            # cluster notifier's move take it from here).
            mark_recheck(self._waiters.get(channel, set()))

    def _published(self, channel: bytes, payload: bytes) -> None:
        if payload in RECHECKS:
            mark_recheck(self._waiters.get(channel, set()))
            return
        if payload == PAUSED:
            mark_give_back(self._waiters.get(channel, ()))
            return
        try:
            last_id = int(payload)
        except ValueError:
            last_id = 0
        for event in self._waiters.get(channel, ()):
            if type(event) is WakeUp and last_id:
                event.publication(last_id)
            else:
                event.woken = True  # type: ignore[attr-defined]  # see _on_tick
                event.set()

    def fail(self, kind: type[rex.RedisError], message: str) -> None:
        super().fail(kind, message)
        confirmations, self._confirmations = self._confirmations, {}
        for futures in confirmations.values():
            for future in futures:
                _resolve(future)  # do not wait: the tick covers the gap
        while self._in_order:
            _resolve(self._in_order.popleft())


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class Notifier:
    """Pub/sub subscriptions of one shard, shared by every local consumer."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        connect_timeout: float,
        retry_max: float,
        tick: float,
        sharded: bool = False,
    ) -> None:
        self._endpoint = endpoint
        self.sharded = sharded
        """Sharded pub/sub (``SSUBSCRIBE``, Redis 7+): publications of a slot's channels
        come from the node serving the slot only (Redis Cluster)."""
        self._connect_timeout = connect_timeout
        self._retry_max = retry_max
        self.tick = tick
        """Seconds between wake-ups of every watcher."""
        self._waiters: dict[bytes, set[asyncio.Event]] = {}
        self._subscription: _Subscription | None = None  # set while subscribed
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._closed = False

    async def watch(self, queue: str) -> WakeUp:
        """An event set whenever ``queue`` gets messages, and at least every
        :attr:`tick` (clear it before each read)."""
        wake = WakeUp()
        await self.adopt(QueueKeys(queue).notify_channel.encode(), wake)
        return wake

    async def adopt(self, channel: bytes, event: asyncio.Event) -> asyncio.Event:
        """Set ``event`` on publications on ``channel`` (and every tick); returns it."""
        waiters = self._waiters.setdefault(channel, set())
        first = not waiters
        waiters.add(event)
        self._start()
        subscription = self._subscription
        if first and subscription is not None:
            confirmed = subscription.subscribe([channel])
            try:
                # Subscribed before the consumer's first read, so no push is missed
                # between the two (bounded: the tick covers a slow answer).
                async with asyncio.timeout(self._connect_timeout):
                    await asyncio.shield(confirmed)
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                self._discard(channel, event)
                raise
        return event

    async def unwatch(self, queue: str, event: asyncio.Event) -> None:
        self._discard(QueueKeys(queue).notify_channel.encode(), event)

    def nudge(self, channel: bytes) -> None:
        """A push to ``channel``'s queue is being sent on this process's hot-path
        connection: wake one of its consumers that waits, so that its read goes out
        right behind the push instead of a round trip later, when the publication comes
        back (see :meth:`WakeUp.stale`)."""
        for event in self._waiters.get(channel, ()):
            if type(event) is WakeUp and event.nudgeable:
                event.nudgeable = False
                event.set()
                return

    def channels(self) -> list[bytes]:
        """The channels watched here."""
        return list(self._waiters)

    def release(self, channel: bytes) -> set[asyncio.Event]:
        """Stop watching ``channel``; returns the events that were waiting on it."""
        events = set(self._waiters.get(channel, ()))
        for event in events:
            self._discard(channel, event)
        return events

    def _discard(self, channel: bytes, event: asyncio.Event) -> None:
        waiters = self._waiters.get(channel)
        if waiters is None:
            return
        waiters.discard(event)
        if not waiters:
            del self._waiters[channel]
            if self._subscription is not None:
                command = b"SUNSUBSCRIBE" if self.sharded else b"UNSUBSCRIBE"
                self._subscription.write((command, channel))

    def follow(self, master: tuple[str, int] | None) -> None:
        """Resubscribe if subscribed elsewhere than ``master`` (``None``: anywhere), as
        after a Sentinel failover; watchers are woken once resubscribed."""
        subscription = self._subscription
        if subscription is None or subscription.error is not None:
            return
        if master is None or (subscription.address not in (None, master)):
            subscription.fail(rex.ConnectionError, "following the master")

    def _start(self) -> None:
        if self._closed:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(
                self._run(), name=f"busmq-notifier {self._endpoint.label}"
            )
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(self.tick, self._on_tick)

    def _on_tick(self) -> None:
        # Only the watchers no publication woke since the last tick: one woken meanwhile
        # has read since, and waking every consumer of a busy process at once is a burst
        # of empty reads (the tail latency of every message behind it).
        for waiters in self._waiters.values():
            for event in waiters:
                if type(event) is WakeUp and event.woken:
                    event.woken = False
                else:
                    event.set()
        self._ticker = None
        if self._waiters and not self._closed:
            self._ticker = asyncio.get_running_loop().call_later(self.tick, self._on_tick)

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            mark_recheck(waiters)

    def give_back_all(self) -> None:
        """Tell every consumer watching here to give back its read-ahead (the master
        moved)."""
        for waiters in self._waiters.values():
            mark_give_back(waiters)

    async def _run(self) -> None:
        endpoint = self._endpoint
        backoff = 0.05
        while self._waiters and not self._closed:
            try:
                subscription = await endpoint.connect(
                    lambda: _Subscription(self, endpoint.label, self._connect_timeout),
                    self._connect_timeout,
                    select=False,  # pub/sub channels do not depend on the database
                )
                await self._subscribe_all(subscription)
            except rex.RedisError as exc:
                log.debug("notifier of %s cannot subscribe: %s", endpoint.label, exc)
                await asyncio.sleep(backoff * (0.5 + random.random() / 2))
                backoff = min(backoff * 2, self._retry_max)
                continue
            backoff = 0.05
            # Publications made while unsubscribed were not announced: read again.
            self._wake_all()
            try:
                await subscription.ended
            finally:
                self._subscription = None
                subscription.fail(rex.ConnectionError, f"notifier of {endpoint.label} stopped")
            log.debug("notifier of %s lost its connection: %s", endpoint.label, subscription.error)

    async def _subscribe_all(self, subscription: _Subscription) -> None:
        """Subscribe to every watched channel and wait for Redis to confirm."""
        self._subscription = subscription  # watch() subscribes its own from now on
        if self._waiters:
            confirmed = subscription.subscribe(list(self._waiters))
            try:
                async with asyncio.timeout(self._connect_timeout):
                    await confirmed
            except TimeoutError:
                subscription.fail(rex.TimeoutError, "no answer to SUBSCRIBE")
        if subscription.error is not None:
            self._subscription = None
            raise subscription.error

    async def close(self) -> None:
        """Stop; every watcher is woken once more (its next read finds the shard closed)."""
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._wake_all()
        self._waiters.clear()
