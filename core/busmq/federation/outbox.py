"""The durable outbox: pushes that could not reach their gateway, kept on disk in order.

One SQLite file (WAL journal, ``synchronous=FULL``: a commit is on disk before
``append`` returns, so an accepted push survives a process or machine crash)::

    CREATE TABLE outbox (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,  -- forwarding order, never reused
        target     TEXT NOT NULL,     -- gateway URL (normalized)
        queue      TEXT NOT NULL,
        request_id TEXT NOT NULL,     -- idempotency key, sent with every attempt
        count      INTEGER NOT NULL,  -- messages in the push
        messages   BLOB NOT NULL,     -- the serialized busmq.v1.PushRequest
        created    REAL NOT NULL      -- Unix time of the push
    );
    CREATE TABLE dead_letters (...same columns..., failed REAL, error TEXT);

Rows are forwarded in ``seq`` order per queue and deleted once the gateway stored them;
a row the gateway refuses for good (an invalid message, a queue that does not exist)
moves to ``dead_letters`` so it cannot block the queue behind it. Once the cause is
fixed (e.g. the queue was created), :meth:`Outbox.requeue` moves dead letters back to
the tail with their ``request_id``; :meth:`Outbox.discard_dead_letters` deletes them.

Appends made in the same event-loop tick share one transaction (one fsync). SQLite runs
on a dedicated thread. A lock file (``<path>.lock``, ``flock``) keeps a second process
from forwarding the same rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import BusError
from ..private import make_dirs, private_file
from .errors import OutboxFullError

log = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    target TEXT NOT NULL,
    queue TEXT NOT NULL,
    request_id TEXT NOT NULL,
    count INTEGER NOT NULL,
    messages BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_by_target ON outbox (target, seq);
CREATE TABLE IF NOT EXISTS dead_letters (
    seq INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    queue TEXT NOT NULL,
    request_id TEXT NOT NULL,
    count INTEGER NOT NULL,
    messages BLOB NOT NULL,
    created REAL NOT NULL,
    failed REAL NOT NULL,
    error TEXT NOT NULL
);
"""
_CHUNK = 500  # ids per DELETE statement (SQLite's variable limit is far above)


class OutboxLockedError(BusError):
    """Another process (or bus) already uses this outbox file."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"outbox {path} is in use by another process")
        self.path = path


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A push waiting in the outbox; ``messages`` is the serialized ``PushRequest``."""

    seq: int
    target: str
    queue: str
    request_id: str
    count: int
    created: float
    messages: bytes = b""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A push the gateway refused for good, kept for inspection."""

    row: OutboxRow
    failed: float
    error: str


@dataclass
class _Append:
    row: OutboxRow
    future: asyncio.Future[int]


class Outbox:
    """The outbox file (see the module docstring). ``open()`` before use.

    Counters (``depth``, ``rows``, ``pending``) include pushes being committed, so a
    push decided "outbox" is visible at once to the next push of the same queue: that
    is what keeps a queue's pushes in order while its outbox rows drain.
    """

    def __init__(self, path: Path, *, max_messages: int, max_age: float | None) -> None:
        self.path = Path(path)
        self.max_messages = max_messages
        self.max_age = max_age
        self.on_change: Callable[[str], None] = lambda target: None
        self._lock_fd: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None
        self._oldest: dict[int, tuple[float, str]] = {}  # seq -> (created, target), seq order
        self._messages: Counter[str] = Counter()  # by target
        self._rows: Counter[str] = Counter()  # by target
        self._queue_rows: Counter[tuple[str, str]] = Counter()  # by (target, queue)
        self._queue_messages: Counter[tuple[str, str]] = Counter()  # by (target, queue)
        self._appends: list[_Append] = []
        self._writer: asyncio.Task[None] | None = None
        self._opened = False
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------

    def lock(self) -> None:
        """Take the file lock (synchronous, immediate): refuses a second user."""
        if self._lock_fd is not None:
            return
        make_dirs(self.path.parent)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutboxLockedError(self.path) from None
        self._lock_fd = fd

    async def open(self) -> None:
        """Lock, open (creating the schema) and index what is left from earlier runs."""
        if self._opened:
            return
        self.lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="busmq-outbox")
        rows = await self._run(self._open_db)
        for seq, target, queue, count, created in rows:
            self._oldest[seq] = (created, target)
            self._count(target, queue, count, +1)
        self._opened = True
        if rows:
            log.info("outbox %s: %d push(es) left to forward", self.path, len(rows))

    def _open_db(self) -> list[tuple[int, str, str, int, float]]:
        # Created 0600 before SQLite opens it: its -wal and -shm files take its mode.
        for path in (self.path, *(Path(f"{self.path}{s}") for s in ("-wal", "-shm"))):
            if path == self.path or path.exists():
                private_file(path)
        db = sqlite3.connect(self.path, isolation_level=None)
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise BusError(f"outbox {self.path}: cannot use WAL journal mode (got {mode})")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA)
        self._db = db
        return db.execute(
            "SELECT seq, target, queue, count, created FROM outbox ORDER BY seq"
        ).fetchall()

    async def close(self) -> None:
        """Finish pending appends and close the file; rows stay for the next run."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        if self._executor is not None:
            with contextlib.suppress(Exception):
                await self._run(self._close_db)
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _close_db(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def _run(self, function: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise BusError("the outbox is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, function, *args)

    # -- counters -------------------------------------------------------------------

    def depth(self, target: str | None = None) -> int:
        """Messages waiting (for one target, or in all)."""
        if target is None:
            return sum(self._messages.values())
        return self._messages[target]

    def rows(self, target: str | None = None) -> int:
        """Pushes waiting (for one target, or in all)."""
        if target is None:
            return sum(self._rows.values())
        return self._rows[target]

    def pending(self, target: str, queue: str) -> int:
        """Pushes waiting for ``queue`` on ``target``: while any, new pushes queue behind."""
        return self._queue_rows[(target, queue)]

    def queue_depth(self, target: str, queue: str) -> int:
        """Messages waiting for ``queue`` on ``target``."""
        return self._queue_messages[(target, queue)]

    def oldest_age(self, target: str | None = None) -> float | None:
        """Seconds the oldest waiting push (for one target, or of all) has waited, if any."""
        for created, row_target in self._oldest.values():
            if target is None or row_target == target:
                return max(0.0, time.time() - created)
        return None

    # -- appending ------------------------------------------------------------------

    async def append(
        self, target: str, queue: str, request_id: str, count: int, request: bytes
    ) -> int:
        """Store a push durably; returns its ``seq`` once committed.

        The bound is checked and the push counted before anything is awaited, so
        pushes are ordered by call. Raises :class:`OutboxFullError` when full.
        """
        self._require_open()
        self._check_room(target, queue, count)
        self._count(target, queue, count, +1)
        row = OutboxRow(0, target, queue, request_id, count, time.time(), request)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._appends.append(_Append(row, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_appends(), name="busmq-outbox-writer")
        return await asyncio.shield(future)

    def _check_room(self, target: str, queue: str, count: int) -> None:
        total = self.depth()
        if total + count > self.max_messages:
            detail = f"{total} of {self.max_messages} messages"
            raise OutboxFullError(target, queue, "max_messages", detail)
        age = self.oldest_age()
        if self.max_age is not None and age is not None and age > self.max_age:
            detail = f"oldest push waiting {age:.0f}s > max_age {self.max_age:g}s"
            raise OutboxFullError(target, queue, "max_age", detail)

    def _count(self, target: str, queue: str, count: int, sign: int) -> None:
        key = (target, queue)
        self._messages[target] += sign * count
        self._rows[target] += sign
        self._queue_messages[key] += sign * count
        self._queue_rows[key] += sign
        if self._rows[target] <= 0:
            del self._rows[target], self._messages[target]
        if self._queue_rows[key] <= 0:
            del self._queue_rows[key], self._queue_messages[key]

    async def _write_appends(self) -> None:
        await asyncio.sleep(0)  # let the appends of this tick join the transaction
        while self._appends:
            batch, self._appends = self._appends, []
            try:
                seqs = await self._run(self._insert, [a.row for a in batch])
            except Exception as exc:
                log.error("outbox %s: write failed: %s", self.path, exc)
                for item in batch:
                    self._count(item.row.target, item.row.queue, item.row.count, -1)
                    if not item.future.done():
                        item.future.set_exception(BusError(f"outbox write failed: {exc}"))
                continue
            targets = set()
            for item, seq in zip(batch, seqs, strict=True):
                self._oldest[seq] = (item.row.created, item.row.target)
                targets.add(item.row.target)
                if not item.future.done():
                    item.future.set_result(seq)
            for target in targets:
                self.on_change(target)

    def _insert(self, rows: list[OutboxRow]) -> list[int]:
        assert self._db is not None
        seqs = []
        with _transaction(self._db):
            for row in rows:
                cursor = self._db.execute(
                    "INSERT INTO outbox (target, queue, request_id, count, messages, created)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (row.target, row.queue, row.request_id, row.count, row.messages, row.created),
                )
                assert cursor.lastrowid is not None
                seqs.append(cursor.lastrowid)
        return seqs

    # -- forwarding -----------------------------------------------------------------

    async def head(self, target: str, limit: int) -> list[OutboxRow]:
        """The oldest ``limit`` committed rows of ``target``, in ``seq`` order."""
        return await self._run(self._select, target, limit)

    def _select(self, target: str, limit: int) -> list[OutboxRow]:
        assert self._db is not None
        found = self._db.execute(
            "SELECT seq, queue, request_id, count, created, messages FROM outbox"
            " WHERE target = ? ORDER BY seq LIMIT ?",
            (target, limit),
        ).fetchall()
        return [OutboxRow(s, target, q, r, c, t, bytes(m)) for s, q, r, c, t, m in found]

    async def remove(self, rows: Iterable[OutboxRow]) -> None:
        """Delete forwarded rows (one transaction)."""
        rows = list(rows)
        if not rows:
            return
        await self._run(self._delete, [r.seq for r in rows])
        self._forget(rows)

    def _delete(self, seqs: list[int]) -> None:
        assert self._db is not None
        with _transaction(self._db):
            for i in range(0, len(seqs), _CHUNK):
                chunk = seqs[i : i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                self._db.execute(f"DELETE FROM outbox WHERE seq IN ({marks})", chunk)

    async def dead_letter(self, row: OutboxRow, error: str) -> None:
        """Move a row the gateway refused for good to ``dead_letters``."""
        await self._run(self._move_dead, row.seq, error)
        self._forget([row])

    def _move_dead(self, seq: int, error: str) -> None:
        assert self._db is not None
        with _transaction(self._db):
            self._db.execute(
                "INSERT OR REPLACE INTO dead_letters"
                " SELECT seq, target, queue, request_id, count, messages, created, ?, ?"
                " FROM outbox WHERE seq = ?",
                (time.time(), error, seq),
            )
            self._db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))

    async def dead_letters(self) -> list[DeadLetter]:
        """Pushes refused for good, oldest first (they stay until requeued with
        :meth:`requeue` or deleted with :meth:`discard_dead_letters`)."""
        return await self._run(self._select_dead)

    def _select_dead(self) -> list[DeadLetter]:
        assert self._db is not None
        found = self._db.execute(
            "SELECT seq, target, queue, request_id, count, created, messages, failed, error"
            " FROM dead_letters ORDER BY seq"
        ).fetchall()
        return [
            DeadLetter(OutboxRow(s, t, q, r, c, cr, bytes(m)), f, e)
            for s, t, q, r, c, cr, m, f, e in found
        ]

    async def requeue(
        self,
        seqs: Iterable[int] | None = None,
        *,
        target: str | None = None,
        queue: str | None = None,
    ) -> int:
        """Move dead letters back to the tail of the outbox; returns how many rows moved.

        Selects the dead letters with the given ``seqs`` (all if ``None``) that also
        match ``target`` and ``queue`` when given. They get new ``seq`` numbers at the
        tail, in their original order, and keep their ``request_id``: a push that was
        stored after all is recognised by the gateway (within its dedupe window) and
        not stored twice. ``created`` becomes the time of the requeue, so ``max_age``
        counts from now rather than refusing every push at once for an old row.

        Requeueing is admitted like a push of the same size: it never takes the outbox
        above ``max_messages`` (or past ``max_age``); if the selection does not fit, it
        raises :class:`OutboxFullError` and moves nothing. Requeue in smaller selections
        (by ``seqs`` or ``queue``) or once the outbox has drained. A requeued row of a
        queue goes after that queue's rows already waiting, so pushes made meanwhile
        arrive first, and new pushes to the queue wait behind it (order).
        """
        self._require_open()
        wanted = None if seqs is None else sorted(set(seqs))
        if wanted == []:
            return 0
        found = await self._run(self._select_dead_keys, wanted, target, queue)
        if not found:
            return 0
        total = sum(count for _, _, _, count in found)
        first_target, first_queue = found[0][1], found[0][2]
        self._check_room(first_target, first_queue, total)
        for _, row_target, row_queue, count in found:  # visible to pushes at once
            self._count(row_target, row_queue, count, +1)
        now = time.time()
        try:
            moved = await self._run(self._move_back, [key[0] for key in found], now)
        except BaseException:
            for _, row_target, row_queue, count in found:
                self._count(row_target, row_queue, count, -1)
            raise
        targets = set()
        for (old_seq, row_target, row_queue, count), new_seq in zip(found, moved, strict=True):
            if new_seq is None:  # discarded or requeued concurrently
                self._count(row_target, row_queue, count, -1)
                continue
            self._oldest[new_seq] = (now, row_target)
            targets.add(row_target)
            log.info("outbox %s: dead letter #%d requeued as #%d", self.path, old_seq, new_seq)
        for row_target in targets:
            self.on_change(row_target)
        return sum(1 for new_seq in moved if new_seq is not None)

    async def discard_dead_letters(
        self,
        seqs: Iterable[int] | None = None,
        *,
        target: str | None = None,
        queue: str | None = None,
    ) -> int:
        """Delete dead letters for good (selected as in :meth:`requeue`); returns how
        many rows were deleted."""
        self._require_open()
        wanted = None if seqs is None else sorted(set(seqs))
        if wanted == []:
            return 0
        found = await self._run(self._select_dead_keys, wanted, target, queue)
        if not found:
            return 0
        return await self._run(self._delete_dead, [key[0] for key in found])

    def _require_open(self) -> None:
        if not self._opened or self._closed:
            raise BusError("the outbox is not open")

    def _select_dead_keys(
        self, seqs: list[int] | None, target: str | None, queue: str | None
    ) -> list[tuple[int, str, str, int]]:
        """(seq, target, queue, count) of the matching dead letters, in ``seq`` order."""
        assert self._db is not None
        where, params = [], list[Any]()
        if target is not None:
            where.append("target = ?")
            params.append(target)
        if queue is not None:
            where.append("queue = ?")
            params.append(queue)
        sql = "SELECT seq, target, queue, count FROM dead_letters"
        chunks: list[list[int] | None] = [None]
        if seqs is not None:
            chunks = [seqs[i : i + _CHUNK] for i in range(0, len(seqs), _CHUNK)]
        found: list[tuple[int, str, str, int]] = []
        for chunk in chunks:
            clauses, args = list(where), list(params)
            if chunk is not None:
                clauses.append(f"seq IN ({','.join('?' * len(chunk))})")
                args.extend(chunk)
            condition = f" WHERE {' AND '.join(clauses)}" if clauses else ""
            found.extend(self._db.execute(sql + condition, args).fetchall())
        return sorted(found)

    def _move_back(self, seqs: list[int], created: float) -> list[int | None]:
        """Move dead letters to the outbox tail in this order (one transaction); the new
        seq of each, or None for one that is no longer there."""
        assert self._db is not None
        moved: list[int | None] = []
        with _transaction(self._db):
            for seq in seqs:
                cursor = self._db.execute(
                    "INSERT INTO outbox (target, queue, request_id, count, messages, created)"
                    " SELECT target, queue, request_id, count, messages, ?"
                    " FROM dead_letters WHERE seq = ?",
                    (created, seq),
                )
                if cursor.rowcount != 1:
                    moved.append(None)
                    continue
                moved.append(cursor.lastrowid)
                self._db.execute("DELETE FROM dead_letters WHERE seq = ?", (seq,))
        return moved

    def _delete_dead(self, seqs: list[int]) -> int:
        assert self._db is not None
        deleted = 0
        with _transaction(self._db):
            for i in range(0, len(seqs), _CHUNK):
                chunk = seqs[i : i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                cursor = self._db.execute(f"DELETE FROM dead_letters WHERE seq IN ({marks})", chunk)
                deleted += cursor.rowcount
        return deleted

    def _forget(self, rows: list[OutboxRow]) -> None:
        targets = set()
        for row in rows:
            if self._oldest.pop(row.seq, None) is not None:
                self._count(row.target, row.queue, row.count, -1)
                targets.add(row.target)
        for target in targets:
            self.on_change(target)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
