"""What the admin commands need of a bus, and its local form: a :class:`~busmq.Bus` on
the configured Redis (``BUSMQ_REDIS_URLS``, or the embedded one). The same operations
through a gateway are in :mod:`busmq.cli.remote`."""

from __future__ import annotations

import dataclasses
import fcntl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from .. import inventory, queue_schema
from ..bus import Bus
from ..errors import QueueNotFoundError
from ..inventory import QueueStats
from ..keys import dead_letter_name
from ..message import EncodedMessage, Message
from ..queue import Queue
from ..schemas import Compatibility, Schema, SchemaVersion, Violation
from ..settings import BusSettings


class Admin(Protocol):
    """The operations behind ``busmq queues|inspect|tail|push|dead|copy|export|import``."""

    where: str
    """What is administered, for messages (Redis URLs or the gateway URL)."""

    async def queues(self, prefix: str = "") -> list[QueueStats]: ...

    async def inspect(self, name: str) -> dict[str, Any]:
        """The queue's figures, controls and metadata (``QueueNotFoundError`` if none)."""
        ...

    def browse(
        self, name: str, from_id: int, to_id: int | None, follow: bool
    ) -> AsyncIterator[list[Message]]:
        """Pages of stored messages, in order, without consuming them."""
        ...

    async def open_for_push(self, name: str, ttl: float | None) -> None:
        """Attach to ``name`` (creating it) until :meth:`close`, so pushes find it."""
        ...

    async def push(self, name: str, messages: Sequence[EncodedMessage]) -> list[int]: ...

    async def requeue_dead(self, name: str, ids: Sequence[int], limit: int) -> list[int]: ...

    async def purge(self, name: str) -> None: ...

    async def schema(self, name: str) -> SchemaState:
        """The queue's schema: current version, mode and every version."""
        ...

    async def set_schema(
        self, name: str, schema: Schema, compatibility: Compatibility | None
    ) -> SchemaVersion: ...

    async def remove_schema(self, name: str) -> None: ...

    async def check_schema(
        self, name: str, messages: Sequence[EncodedMessage]
    ) -> tuple[int, list[Violation]] | None:
        """What of ``messages`` does not fit the queue's schema (``None``: it has none)."""
        ...

    async def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class SchemaState:
    """What ``busmq schema`` shows of a queue's schema."""

    current: int | None
    compatibility: Compatibility
    versions: list[SchemaVersion]


def details(stats: QueueStats, **extra: Any) -> dict[str, Any]:
    """``busmq inspect``'s fields: the figures, then the controls and metadata."""
    fields = dataclasses.asdict(stats)
    for name in ("rate_limit", "key_rate_limit"):
        limit = getattr(stats, name)
        fields[name] = None if limit is None else dataclasses.asdict(limit)
    return {**fields, **extra}


def running_embedded(settings: BusSettings) -> BusSettings:
    """``settings``, or, when they name no Redis and another process (a gateway started
    by ``scripts/run.sh``, an application) runs the embedded Redis of their data
    directory, settings for that server's socket: an admin command looks at the bus that
    is running rather than failing on the directory's lock."""
    if settings.redis_urls:
        return settings
    data_dir = Path(settings.data_dir)
    socket = data_dir.resolve() / "redis.sock"
    lock = data_dir / "busmq.lock"
    if not (socket.exists() and lock.exists()):
        return settings
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: that process's server is up
            return dataclasses.replace(settings, redis_urls=(f"unix://{socket}",))
        fcntl.flock(handle, fcntl.LOCK_UN)
    return settings


class LocalAdmin:
    """:class:`Admin` on a bus of this process."""

    def __init__(self, settings: BusSettings) -> None:
        self.bus = Bus(settings)
        self.where = ""
        self._attached: dict[str, Queue] = {}

    async def connect(self) -> None:
        await self.bus.connect()
        if self.bus.embedded is not None:
            self.where = f"embedded Redis in {self.bus.settings.data_dir}"
        else:
            self.where = ", ".join(s.label for s in self.bus.shards)

    async def queues(self, prefix: str = "") -> list[QueueStats]:
        return (await inventory.list_stats(self.bus.shards, prefix=prefix)).queues

    async def inspect(self, name: str) -> dict[str, Any]:
        queue = self.bus.queue(name)
        found = [s for s in await self.queues(name) if s.name == name]
        if not found:
            raise QueueNotFoundError(name)
        info = await queue.info()
        state = info.ordering_state
        return details(
            found[0],
            max_deliveries=info.max_deliveries,
            drop_expired=info.drop_expired,
            oldest_ordered_wait_seconds=None if state is None else state.oldest_waiting_age,
            metadata=await queue.metadata(),
        )

    async def browse(
        self, name: str, from_id: int, to_id: int | None, follow: bool
    ) -> AsyncIterator[list[Message]]:
        queue = self.bus.queue(name)
        if not await queue.exists():
            raise QueueNotFoundError(name)
        async for page in inventory.browse_pages(queue.store, from_id, to_id, follow=follow):
            yield page

    async def open_for_push(self, name: str, ttl: float | None) -> None:
        if name not in self._attached:
            queue = self.bus.queue(name)
            await queue.attach(ttl=ttl)
            self._attached[name] = queue

    async def push(self, name: str, messages: Sequence[EncodedMessage]) -> list[int]:
        result = await self.bus.queue(name).push_encoded(messages)
        return result.ids

    async def requeue_dead(self, name: str, ids: Sequence[int], limit: int) -> list[int]:
        return await self.bus.queue(name).requeue_dead(list(ids) or None, limit=limit)

    async def purge(self, name: str) -> None:
        dead = self.bus.queue(dead_letter_name(name))
        if not await dead.exists():
            raise QueueNotFoundError(dead.name)
        await dead.flush()

    async def schema(self, name: str) -> SchemaState:
        queue = self.bus.queue(name)
        await queue.store.require_exists()
        current, mode, versions = await queue_schema.versions(queue.store)
        return SchemaState(current, mode, versions)

    async def set_schema(
        self, name: str, schema: Schema, compatibility: Compatibility | None
    ) -> SchemaVersion:
        return await self.bus.queue(name).set_schema(schema, compatibility=compatibility)

    async def remove_schema(self, name: str) -> None:
        await self.bus.queue(name).remove_schema()

    async def check_schema(
        self, name: str, messages: Sequence[EncodedMessage]
    ) -> tuple[int, list[Violation]] | None:
        queue = self.bus.queue(name)
        await queue.store.require_exists()
        return await queue.check_schema([m.payload for m in messages])

    async def close(self) -> None:
        for queue in self._attached.values():
            await queue.detach()
        await self.bus.close()
