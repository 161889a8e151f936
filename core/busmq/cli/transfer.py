"""The admin commands that write: ``push``, ``copy``, ``export`` and ``import``.

Messages go in batches of :data:`BATCH` (one atomic push each, in order), so a copy or
import of a million messages is a few thousand round trips; a failure stops the command
with what was written so far reported, never a gap in the middle: batches are stored
whole or not at all, one after the other.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import IO

from ..message import EncodedMessage, Message, PayloadKind, encode_headers
from ..private import open_private
from .admin import Admin
from .output import Output
from .records import RecordError, parse_line, to_line

BATCH = 500


class Written:
    """How many messages a command stored, and their first and last ids."""

    def __init__(self) -> None:
        self.count = 0
        self.first: int | None = None
        self.last: int | None = None

    def add(self, ids: list[int]) -> None:
        if ids:
            self.first = ids[0] if self.first is None else self.first
            self.last = ids[-1]
            self.count += len(ids)

    def report(self, out: Output, verb: str, where: str) -> None:
        if out.as_json:
            out.json(
                {verb: self.count, "queue": where, "first_id": self.first, "last_id": self.last}
            )
        elif self.count:
            out.line(f"{verb} {self.count} message(s) into {where}: ids {self.first}..{self.last}")
        else:
            out.line(f"{verb} nothing into {where}")


async def _write(
    admin: Admin, queue: str, batches: AsyncIterator[list[EncodedMessage]], out: Output,
    what: str, total: int | None, verb: str,
) -> int:  # fmt: skip
    written = Written()
    try:
        with out.progress(what, total) as advance:
            async for batch in batches:
                written.add(await admin.push(queue, batch))
                advance(len(batch))
    finally:
        written.report(out, verb, queue)
    return 0


def _chunks(items: Iterable[EncodedMessage]) -> Iterator[list[EncodedMessage]]:
    batch: list[EncodedMessage] = []
    for item in items:
        batch.append(item)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def _from_sync(chunks: Iterator[list[EncodedMessage]]) -> AsyncIterator[list[EncodedMessage]]:
    for chunk in chunks:
        yield chunk


def _push_lines(
    lines: IO[str], kind: PayloadKind, headers: dict[str, str]
) -> Iterator[EncodedMessage]:
    encoded_headers = encode_headers(headers)
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        if not line:
            continue
        if kind is PayloadKind.JSON:
            try:
                json.loads(line)
            except ValueError as exc:
                raise RecordError(f"line {number}: not JSON: {exc}") from None
        yield EncodedMessage(line.encode("utf-8"), kind, encoded_headers)


def _headers(pairs: list[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise RecordError(f"--header {pair!r}: use name=value")
        headers[name] = value
    return headers


async def push(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    kind = {"text": PayloadKind.TEXT, "json": PayloadKind.JSON, "bytes": PayloadKind.BYTES}
    lines = _push_lines(args.file, kind[args.kind], _headers(args.header))
    await admin.open_for_push(args.queue, args.ttl)
    return await _write(
        admin, args.queue, _from_sync(_chunks(lines)), out, "pushing", None, "pushed"
    )


async def _records_of(
    admin: Admin, queue: str, from_id: int, to_id: int | None
) -> AsyncIterator[list[EncodedMessage]]:
    async for page in admin.browse(queue, from_id, to_id, False):
        for start in range(0, len(page), BATCH):
            yield [_encoded(m) for m in page[start : start + BATCH]]


def _encoded(message: Message) -> EncodedMessage:
    return EncodedMessage(message.payload, message.kind, encode_headers(message.headers))


async def _count(admin: Admin, queue: str) -> int | None:
    found = [s for s in await admin.queues(queue) if s.name == queue]
    return found[0].messages if found else None


async def copy(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    if args.into == args.queue and args.to_id is None:
        out.error("copying a queue into itself needs --to-id (or it would never end)")
        return 2
    total = await _count(admin, args.queue)
    await admin.open_for_push(args.into, args.ttl)
    batches = _records_of(admin, args.queue, args.from_id, args.to_id)
    return await _write(admin, args.into, batches, out, f"copying {args.queue}", total, "copied")


async def export(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    """Write the range to ``args.file`` (``-`` is stdout), created 0600: it holds
    message payloads."""
    total = await _count(admin, args.queue)
    to_stdout = args.file == "-"
    with (
        contextlib.nullcontext(sys.stdout) if to_stdout else open_private(Path(args.file)) as target
    ):
        exported = await _export_to(admin, out, args, total, target)
    if not to_stdout:
        if out.as_json:
            out.json({"exported": exported, "queue": args.queue, "file": args.file})
        else:
            out.line(f"exported {exported} message(s) of {args.queue} to {args.file}")
    return 0


async def _export_to(
    admin: Admin, out: Output, args: argparse.Namespace, total: int | None, target: IO[str]
) -> int:
    exported = 0
    with out.progress(f"exporting {args.queue}", total) as advance:
        async for page in admin.browse(args.queue, args.from_id, args.to_id, False):
            target.write("".join(to_line(m) + "\n" for m in page))
            exported += len(page)
            advance(len(page))
    target.flush()
    return exported


async def import_(admin: Admin, out: Output, args: argparse.Namespace) -> int:
    # Every line is checked before the first push: a file with a bad line imports nothing.
    lines = [line for line in args.file if line.strip()]
    messages = [parse_line(line, number) for number, line in enumerate(lines, 1)]
    await admin.open_for_push(args.queue, args.ttl)
    batches = _from_sync(_chunks(messages))
    what = f"importing {args.file.name}"
    return await _write(admin, args.queue, batches, out, what, len(messages), "imported")
