"""Forwarding a delivery: storing the messages made from it in a target queue and acking
it, exactly once (:meth:`busmq.Delivery.forward`).

There are two ways, chosen per target:

- **One step**, when the source and the target queue live on the same Redis server and
  it is not a cluster: ``forward.lua`` acks the delivery and stores the messages in one
  script. A delivery that is no longer pending (acked by a consumer that held it
  before, or settled otherwise) stores nothing.
- **Through the source queue's outbox** otherwise (another shard, another cluster slot,
  another bus, a federated queue):

  1. ``forward_out.lua``, in the source's slot, records the messages as an entry of the
     source's outbox stream, numbered by the source's outbox sequence, and notes the
     entry against the delivery and the target: a redelivery of the same message reuses
     it, whatever its handler makes this time.
  2. The target's entries up to this one are pushed to the target in order, as an
     idempotent producer named after the outbox, each with its entry's number as its
     sequence (:mod:`busmq.pushing`): one stored already is a duplicate and stores
     nothing. In order is what makes forwarders running side by side safe: an entry is
     deleted only once stored, and each forwarder pushes every entry before its own, so
     nothing is stored after a later entry of the same target.
  3. The delivery is acked. The entries stored are deleted by the next step 1, which
     is told the number up to which this process knows them stored.

  A crash between the steps leaves the delivery pending: it is redelivered, and its
  ``forward`` finds the entry recorded the first time. A link to a federated target that
  is down keeps the push in the federation outbox, with its sequence.

The outbox path costs a round trip more than a push and an ack; the one step costs one
round trip fewer.
"""

from __future__ import annotations

import secrets
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import DurabilityError, RedisCommandError, UnknownMessageError
from .message import EncodedMessage, ForwardTarget, PayloadKind
from .pushing import Item, Producer, flatten, schema_arg
from .queue_schema import SCHEMA_ATTEMPTS, learn_schema

if TYPE_CHECKING:
    from .mux import MuxClient
    from .queue_store import QueueStore

MAX_FORWARD = 1000
"""The most messages one forward stores (a script's arguments are bounded)."""

_STORED: weakref.WeakKeyDictionary[Any, dict[str, dict[str, int]]] = weakref.WeakKeyDictionary()
"""Per bus, source queue and target label: the outbox entry number up to which every
entry is known stored in the target (see :class:`Forwarder`)."""


class Forwarder:
    """The forwards of one consumer of ``source`` (created on its first forward)."""

    def __init__(self, source: QueueStore) -> None:
        self.source = source
        # Per target label, the entry number up to which every entry is known stored,
        # shared by this process's forwarders of the queue: none pushes those again.
        bus_marks = _STORED.setdefault(source.bus, {})
        self._stored = bus_marks.setdefault(source.name, {})

    async def forward(
        self,
        message_id: int,
        target: ForwardTarget,
        items: Sequence[Item],
        ack: Callable[[], Awaitable[None]] | None,
    ) -> bool:
        """Store ``items`` in ``target`` and settle delivery ``message_id`` by ``ack``,
        exactly once; ``False`` if the delivery was settled already (nothing stored).
        Without ``ack`` the delivery is settled later by its holder (a service request,
        by its reply): once per delivery and target, through the outbox."""
        if len(items) > MAX_FORWARD:
            raise ValueError(f"a forward stores at most {MAX_FORWARD} messages")
        flat, count = flatten(items, self.source.bus.settings.max_message_bytes)
        if not count:
            return True if ack is None else await _acked(ack)
        target_store = None if ack is None else await self._same_server(target)
        if target_store is not None:
            return await self._in_one_step(message_id, target_store, flat, count)
        return await self._through_outbox(message_id, target, flat, count, ack)

    async def _same_server(self, target: ForwardTarget) -> QueueStore | None:
        """The target's store if it lives on the source's server (not a cluster)."""
        store: QueueStore | None = getattr(target, "store", None)
        if store is None or store.bus is not self.source.bus:
            return None
        shard = await self.source.located()
        if shard.identity == "cluster" or await store.located() is not shard:
            return None
        return store

    # -- one step ---------------------------------------------------------------------

    async def _in_one_step(
        self, message_id: int, target: QueueStore, flat: list[Any], count: int
    ) -> bool:
        source, bus = self.source, self.source.bus
        keys = [
            target.keys.info,
            target.keys.stream,
            target.keys.due,
            target.keys.delayed,
            *source.keys.ack_keys,
        ]
        args = [
            message_id,
            0,
            target.keys.notify_channel,
            "",
            "",
            1 if len(flat) == count else 3,
            "",
            await schema_arg(target, flat, count),
            *flat,
        ]
        level = bus.settings.durability
        attempts = 0
        shortfall = None

        async def run(mux: MuxClient) -> Any:
            nonlocal attempts
            attempts += 1
            return await bus.scripts.call(mux, "forward", keys, args)

        for attempt in range(SCHEMA_ATTEMPTS):
            try:
                if level.is_async:
                    # Safe to send again: once applied, the delivery is no longer pending.
                    reply = await source.run_fast(run, idempotent=True)
                else:
                    shard = await source.located()
                    sha, script = bus.scripts.source("forward")
                    reply, shortfall = await shard.run_durable(
                        sha, script, keys, args, level, route=source.keys.stream
                    )
                break
            except RedisCommandError as exc:
                if attempt == SCHEMA_ATTEMPTS - 1 or not learn_schema(target, exc):
                    raise target.script_error(exc) from None
                args[7] = await schema_arg(target, flat, count)  # checked again, not stored
                attempts = 0
        first = int(reply[0])
        if first < 0:
            return attempts > 1  # a lost reply's attempt applied it
        bus.counters.add("acked", source.name, 1)
        bus.counters.add("pushed", target.name, count)
        if shortfall is not None:
            raise DurabilityError(
                f"forward to {target.name!r} applied but not confirmed {level}: {shortfall}",
                shard.label,
                list(range(first, first + count)),
            )
        return True

    # -- through the outbox -----------------------------------------------------------

    async def _through_outbox(
        self,
        message_id: int,
        target: ForwardTarget,
        flat: list[Any],
        count: int,
        ack: Callable[[], Awaitable[None]] | None,
    ) -> bool:
        source = self.source
        keys = source.keys
        label = await _label(target, source)
        args = [
            message_id,
            label,
            self._stored.get(label, 0),
            secrets.token_hex(8),
            1 if len(flat) == count else 3,
            *flat,
        ]
        script_keys = [keys.info, keys.stream, keys.alias, keys.state, keys.parked, keys.outbox]
        # Safe to send again: a retry finds the entry recorded by the first attempt.
        reply = await source.run_fast(
            lambda m: source.bus.scripts.call(m, "forward_out", script_keys, args),
            idempotent=True,
        )
        seq = int(reply[0])
        if seq < 0:
            return False
        oid, entries, last = _text(reply[1]), reply[2], reply[3]
        producer = Producer(f"fwd:{oid}:{source.name}"[:200])
        own = f"{seq}-0".encode()
        while True:
            for entry_id, fields in entries:
                number = int(entry_id[: entry_id.index(b"-")])
                if number <= self._stored.get(label, 0):
                    continue  # pushed by another forwarder of this process meanwhile
                await target.push_encoded(_messages(fields), producer=producer, sequence=number)
                self._stored[label] = max(number, self._stored.get(label, 0))
            if not last:
                break
            entries, last = await self._entries_after(last, own, label)
        if ack is not None:
            await _acked(ack)  # False: a redelivery was forwarded with the same entry, acked
        return True

    async def _entries_after(self, last: bytes, own: bytes, label: str) -> tuple[list[Any], bytes]:
        """The label's outbox entries after ``last`` up to ``own``, and ``b""`` or where
        the look stopped short of ``own``."""
        outbox = self.source.keys.outbox
        batch = await self.source.run_fast(
            lambda m: m.execute("XRANGE", outbox, b"(" + last, own, "COUNT", 1000),
            idempotent=True,
        )
        wanted = label.encode()
        mine = [e for e in batch if e[1][1] == wanted]
        stopped = batch[-1][0] if len(batch) == 1000 and batch[-1][0] != own else b""
        return mine, stopped


async def _label(target: ForwardTarget, source: QueueStore) -> str:
    """What names ``target`` in the source's outbox, the same in every process: its
    name on this bus, with the server or the gateway it lives on otherwise."""
    store: QueueStore | None = getattr(target, "store", None)
    if store is not None:
        if store.bus is source.bus:
            return target.name
        return f"{target.name}@{(await store.located()).identity}"
    return f"{target.name}@{getattr(target, 'target', '?')}"


def _messages(fields: Sequence[bytes]) -> list[EncodedMessage]:
    """The messages of an outbox entry: t <label> x <stride> then v <value> each."""
    stride = int(fields[3])
    values = fields[5::2]
    if stride == 1:
        return [EncodedMessage(value, PayloadKind.BYTES, b"") for value in values]
    return [
        EncodedMessage(values[i], PayloadKind(values[i + 1]), values[i + 2])
        for i in range(0, len(values), 3)
    ]


async def _acked(ack: Callable[[], Awaitable[None]]) -> bool:
    try:
        await ack()
    except UnknownMessageError:
        return False
    return True


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
