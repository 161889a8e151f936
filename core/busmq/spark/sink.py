"""The ``busmq`` PySpark data source's writers: batch and streaming sinks.

Each task pushes its rows in batches numbered the same way in every attempt of the task,
so a retried task stores nothing twice: as an idempotent producer's push (no time
window) in a streaming sink, else with a ``request_id`` (remembered for
``dedupe_seconds``). The queue is reached on its Redis shard, or through a gateway.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from ..schemas import SchemaError, Violation
from . import _core
from ._core import OptionError
from ._gateway import Gateway


@dataclass(frozen=True)
class WriteConfig:
    url: str
    queue: str
    kind: str
    batch_size: int
    dedupe_seconds: float
    max_message_bytes: int
    payload_index: int
    headers_index: int | None
    job: str
    lease_member: str | None
    lease_seconds: float
    fail_after_rows: int | None
    streaming: bool = False
    sequenced: bool = False
    gateway: Gateway | None = None


def write_config(
    options: Mapping[str, str], schema: StructType, overwrite: bool, *, streaming: bool = False
) -> WriteConfig:
    if overwrite:
        raise OptionError("the busmq sink only appends: use mode('append')")
    gateway = Gateway.from_options(options)
    urls = _core.parse_urls(options) if gateway is None else ()
    queues = _core.parse_queues(options, "queue")
    if len(queues) != 1:
        raise OptionError("option 'queue' names exactly one queue")
    queue = queues[0]
    names = schema.fieldNames()
    if "payload" not in names:
        raise OptionError(f"the busmq sink needs a 'payload' column, got columns {names}")
    payload_type = schema["payload"].dataType
    if not isinstance(payload_type, BinaryType | StringType):
        raise OptionError(f"column 'payload' must be binary or string, not {payload_type}")
    headers_index = None
    if "headers" in names:
        headers_type = schema["headers"].dataType
        if not (
            isinstance(headers_type, MapType)
            and isinstance(headers_type.keyType, StringType)
            and isinstance(headers_type.valueType, StringType)
        ):
            raise OptionError(f"column 'headers' must be map<string,string>, not {headers_type}")
        headers_index = names.index("headers")
    kind = _core.parse_choice(options, "kind", ("auto", "bytes", "text", "json"))
    create = _core.parse_bool(options, "create")
    ttl = _core.parse_float(options, "ttl", 600.0)
    write_id = _core._get(options, "write_id")
    if write_id is not None and not 1 <= len(write_id) <= 100:
        raise OptionError("option 'write_id' must be 1-100 characters")
    job = write_id or uuid.uuid4().hex
    member = None
    if gateway is not None:
        url, exists = gateway.url, gateway.attach(queue, ttl, create)
        member = f"spark:{job}" if create else None
    else:
        url, exists = _core.locate(urls, queue)
        if create:
            member = f"spark:{job}"
            _core.attach(url, queue, member, ttl, ttl, create=True)
    if not exists and not create:
        raise OptionError(f"unknown queue {queue!r}: attach it first, or set option create=true")
    return WriteConfig(
        url=url,
        queue=queue,
        kind=kind,
        batch_size=_core.parse_int(options, "batch_size", _core.WRITE_BATCH, 1) or 1,
        dedupe_seconds=_core.parse_float(options, "dedupe_seconds", _core.DEFAULT_DEDUPE_SECONDS),
        max_message_bytes=_core.parse_int(
            options, "max_message_bytes", _core.DEFAULT_MAX_MESSAGE_BYTES, 1
        )
        or 1,
        payload_index=names.index("payload"),
        headers_index=headers_index,
        job=job,
        lease_member=member,
        lease_seconds=ttl,
        fail_after_rows=_core.parse_int(options, "fail_after_rows", None, 1),
        streaming=streaming and write_id is None,
        sequenced=streaming and write_id is None,
        gateway=gateway,
    )


@dataclass
class PushCommit(WriterCommitMessage):
    """What one task stored: messages pushed and batches found already stored."""

    pushed: int
    duplicates: int


def _write_task(config: WriteConfig, rows: Iterator[Any]) -> PushCommit:
    """Push the rows of one task in batches, numbered the same in every attempt of the
    task (see :func:`_numbering`), so a retried task stores each batch once."""
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context else 0
    numbering = _numbering(config, context)
    if config.lease_member is not None:
        _renew(config)
    result = PushCommit(0, 0)
    flat: list[bytes | str] = []
    count = index = seen = 0
    with _pusher(config) as push:

        def flush() -> None:
            nonlocal flat, count, index
            request_id, producer = numbering(index)
            try:
                _, duplicate = push(flat, request_id, producer)
            except SchemaError as exc:
                partition = context.partitionId() if context else 0
                raise RowsRefused(exc, partition, seen - count, flat[::3]) from None
            if duplicate:
                result.duplicates += 1
            else:
                result.pushed += count
            flat, count, index = [], 0, index + 1

        for row in rows:
            headers = row[config.headers_index] if config.headers_index is not None else None
            flat += _core.encode_row(
                row[config.payload_index], headers, config.kind, config.max_message_bytes
            )
            count += 1
            seen += 1
            if count >= config.batch_size:
                flush()
                fail_at = config.fail_after_rows
                if fail_at is not None and attempt == 0 and seen >= fail_at:
                    raise RuntimeError(f"busmq test: injected failure after {seen} rows")
        if count:
            flush()
    return result


class RowsRefused(SchemaError):
    """A write task's batch refused by the queue's schema (none of it was stored), naming
    the rows of the task's partition that do not fit, numbered from 0."""

    def __init__(
        self, refused: SchemaError, partition: int, first_row: int, payloads: list[bytes | str]
    ) -> None:
        rows = [
            Violation(first_row + v.index, v.pointer, v.rule, v.message) for v in refused.violations
        ]
        super().__init__(refused.queue, refused.version, rows)
        self.partition = partition
        named = "; ".join(
            f"row {v.index} {_preview(payloads[v.index - first_row])} at {v.pointer or '/'}: "
            f"{v.message} ({v.rule})"
            for v in rows[:3]
        )
        more = f" (and {len(rows) - 3} more)" if len(rows) > 3 else ""
        last = first_row + len(payloads) - 1
        self.args = (
            f"busmq writer, partition {partition}: queue {refused.queue!r} schema version "
            f"{refused.version} refused {named}{more}; rows {first_row} to {last} of the "
            "partition were not stored",
        )


def _preview(payload: bytes | str, limit: int = 80) -> str:
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    return repr(text if len(text) <= limit else text[:limit] + "...")


Push = Callable[[list[bytes | str], str, tuple[str, int] | None], tuple[int, bool]]


def _renew(config: WriteConfig) -> None:
    """Keep a queue the sink created alive for ``ttl`` more (see ``create``)."""
    if config.gateway is not None:
        config.gateway.attach(config.queue, config.lease_seconds, create=False)
        return
    assert config.lease_member is not None
    ttl = config.lease_seconds
    _core.attach(config.url, config.queue, config.lease_member, ttl, ttl, create=False)


@contextlib.contextmanager
def _pusher(config: WriteConfig) -> Iterator[Push]:
    """Pushes of a batch's (payload, kind, headers) triples to the sink's queue, on its
    Redis shard or through its gateway."""
    gateway = config.gateway
    if gateway is not None:
        with gateway.stub() as stub:
            yield lambda flat, request_id, producer: gateway.push(
                stub, config.queue, flat, request_id, producer
            )
        return
    with _core.client(config.url) as client:
        yield lambda flat, request_id, producer: _core.push(
            client, config.queue, flat, request_id, config.dedupe_seconds, producer
        )


MAX_BATCHES_PER_TASK = 2**20
"""Push batches one task may write per micro-batch: a producer's sequence is
``micro-batch * MAX_BATCHES_PER_TASK + batch index``."""


def _numbering(
    config: WriteConfig, context: Any
) -> Callable[[int], tuple[str, tuple[str, int] | None]]:
    """How the task's batch ``index`` is pushed: its request id, and in a streaming sink
    its producer (name, sequence).

    ``<job>`` is option ``write_id`` if given, else the streaming query's id for a
    streaming sink, else an id drawn when the write was planned. A streaming sink (without
    ``write_id``) pushes as producer ``spark:<digest of the query id>:<partition>``, its
    sequence growing with the micro-batch and the batch index: a retried task, or a
    micro-batch run again after the query restarted, is stored once however much later,
    and each queue keeps one producer per partition of the query. Other writes use
    request ids ``spark-<job>-<micro-batch>-<partition>-<index>``, remembered for
    ``dedupe_seconds``: a one-off write (or a ``write_id`` per ``foreachBatch`` call)
    would otherwise leave a producer behind in the queue for every write."""
    partition = context.partitionId() if context else 0
    job = config.job
    micro_batch = "b"
    if context is not None:
        if config.streaming:
            job = context.getLocalProperty("sql.streaming.queryId") or job
        micro_batch = context.getLocalProperty("streaming.sql.batchId") or "b"
    producer = f"spark:{hashlib.sha256(job.encode()).hexdigest()[:24]}:{partition}"
    base = (int(micro_batch) if micro_batch.isdigit() else 0) * MAX_BATCHES_PER_TASK

    def number(index: int) -> tuple[str, tuple[str, int] | None]:
        request_id = f"spark-{job}-{micro_batch}-{partition}-{index}"
        if not config.sequenced:
            return request_id, None
        if index >= MAX_BATCHES_PER_TASK:
            raise RuntimeError(
                f"busmq sink: more than {MAX_BATCHES_PER_TASK} push batches in one task; "
                "raise option batch_size"
            )
        return request_id, (producer, base + index)

    return number


class BusWriter(DataSourceWriter):
    def __init__(self, config: WriteConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write_task(self.config, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every batch is already stored by its task."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Stored batches stay (a queue has no transactions); a re-run dedupes them."""


class BusStreamWriter(DataSourceStreamWriter):
    def __init__(self, config: WriteConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write_task(self.config, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every batch is already stored by its task."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Stored batches stay; re-running the micro-batch dedupes them."""
