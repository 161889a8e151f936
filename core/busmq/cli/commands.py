"""The admin commands that look at queues: ``queues``, ``inspect``, ``tail`` and ``dead``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..errors import QueueNotFoundError
from ..inventory import QueueStats
from ..keys import DEAD_SUFFIX, dead_letter_name
from ..message import Message
from .admin import Admin
from .output import Output, rate, seconds
from .records import to_line, to_record

QUEUE_COLUMNS = (
    "queue", "depth", "pending", "oldest pending", "consumers", "delayed", "dead letters",
    "mode", "ttl", "controls",
)  # fmt: skip


def _controls(stats: QueueStats) -> str:
    parts = ["paused"] if stats.paused else []
    parts += [rate(limit) for limit in (stats.rate_limit, stats.key_rate_limit) if limit]
    if stats.ordering:
        parts.append(
            f"ordered by {stats.ordering} ({stats.ordered_keys_in_flight} keys in flight, "
            f"{stats.ordered_waiting} waiting)"
        )
    return ", ".join(parts)


def _queue_json(stats: QueueStats) -> dict[str, Any]:
    fields = dataclasses.asdict(stats)
    fields["depth"] = fields.pop("ready")
    return fields


async def queues(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    found = await admin.queues(args.prefix)
    if not args.all:
        found = [s for s in found if not s.is_dead_letter_queue]
    if out.as_json:
        out.json([_queue_json(s) for s in found])
        return 0
    rows = [
        (s.name, s.ready, s.pending, s.oldest_pending_seconds, s.consumers, s.delayed,
         s.dead_letters, s.mode, s.ttl, _controls(s))
        for s in found
    ]  # fmt: skip
    out.table(f"{len(found)} queue(s) on {admin.where}", QUEUE_COLUMNS, rows)
    return 0


async def inspect(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    fields = await admin.inspect(args.queue)
    if out.as_json:
        fields["depth"] = fields.pop("ready")
        out.json(fields)
        return 0
    stats: dict[str, Any] = dict(fields)
    metadata = stats.pop("metadata")
    rows = [
        ("stored messages", stats["messages"]),
        ("depth (not delivered)", stats["ready"]),
        ("pending (unacked)", stats["pending"]),
        ("oldest pending", seconds(stats["oldest_pending_seconds"])),
        ("delayed", stats["delayed"]),
        ("dead letters", stats["dead_letters"]),
        ("last id", stats["last_id"]),
        ("delivered (first reads)", stats["delivered"]),
        ("consumers", stats["consumers"]),
        ("attachments", stats["attachments"]),
        ("mode", stats["mode"]),
        ("ttl", seconds(stats["ttl"])),
        ("paused", stats["paused"]),
        ("rate limit", _limit_text(stats["rate_limit"])),
        ("per-key rate limit", _limit_text(stats["key_rate_limit"])),
        ("max deliveries", stats["max_deliveries"]),
        ("expired messages", "dropped" if stats["drop_expired"] else "dead-lettered"),
        ("ordered by", stats.get("ordering") or "-"),
        *_ordering_rows(stats),
        ("shard", stats["shard"]),
        *((f"metadata {key}", value) for key, value in sorted(metadata.items())),
    ]
    out.table(f"queue {args.queue}", ("", "value"), rows)
    return 0


def _ordering_rows(stats: dict[str, Any]) -> list[tuple[str, Any]]:
    if not stats.get("ordering"):
        return []
    return [
        ("keys with a delivery in flight", stats["ordered_keys_in_flight"]),
        ("messages waiting for their key", stats["ordered_waiting"]),
        ("oldest waiting", seconds(stats["oldest_ordered_wait_seconds"] or 0)),
    ]


def _limit_text(limit: dict[str, Any] | None) -> str:
    if limit is None:
        return ""
    text = f"{limit['limit']}/{limit['per_seconds']:g} s"
    return f"{text} per {limit['key']}" if limit["key"] else text


def _print_message(out: Output, message: Message) -> None:
    if out.as_json:
        out.line(to_line(message))
        return
    record = to_record(message)
    headers = " ".join(f"{k}={v}" for k, v in sorted(message.headers.items()))
    payload = record["payload"] if record["kind"] != "bytes" else f"base64:{record['payload']}"
    out.line(f"#{message.id} {headers + ' ' if headers else ''}{payload}")


async def tail(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    from_id = args.from_id
    if from_id is None:  # the last --lines ids
        found = [s for s in await admin.queues(args.queue) if s.name == args.queue]
        if not found:
            raise QueueNotFoundError(args.queue)
        from_id = max(found[0].last_id - args.lines + 1, 0)
    async for page in admin.browse(args.queue, from_id, None, args.follow):
        for message in page:
            _print_message(out, message)
    return 0


async def dead(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    if args.queue.endswith(DEAD_SUFFIX):
        out.error(f"give the queue, not its dead-letter queue: {args.queue[: -len(DEAD_SUFFIX)]}")
        return 2
    actions = {"ls": _dead_ls, "requeue": _dead_requeue, "purge": _dead_purge}
    return await actions[args.action](admin, out, args)


async def _dead_ls(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    shown = 0
    try:
        async for page in admin.browse(dead_letter_name(args.queue), 0, None, False):
            for message in page[: args.limit - shown if args.limit else None]:
                _print_message(out, message)
                shown += 1
            if args.limit and shown >= args.limit:
                break
    except QueueNotFoundError:
        await _require(admin, args.queue)  # a queue without dead letters: none to list
    if not out.as_json:
        out.note(f"{shown} dead letter(s) shown")
    return 0


async def _dead_requeue(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    if not (args.id or args.all or args.limit):
        out.error("say which: --id N (repeatable), --limit N (oldest first) or --all")
        return 2
    ids = await admin.requeue_dead(args.queue, args.id or [], 0 if args.all else args.limit)
    if out.as_json:
        out.json({"requeued": len(ids), "ids": ids})
    else:
        out.line(f"requeued {len(ids)} dead letter(s) into {args.queue}")
    return 0


async def _dead_purge(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    if not args.yes:
        out.error(f"purge removes every dead letter of {args.queue}: confirm with --yes")
        return 2
    try:
        await admin.purge(args.queue)
    except QueueNotFoundError:
        await _require(admin, args.queue)  # no dead letters: nothing to purge
    if out.as_json:
        out.json({"purged": True})
    else:
        out.line(f"purged the dead letters of {args.queue}")
    return 0


async def _require(admin: Admin, queue: str) -> None:
    if not any(s.name == queue for s in await admin.queues(queue)):
        raise QueueNotFoundError(queue)
