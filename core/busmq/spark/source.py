"""The ``busmq`` PySpark data source: batch and streaming reads, batch and streaming writes.

Reads are non-destructive (XRANGE on the queue's stream, the replay semantics); writes
run the core's push script, each batch of rows numbered the same way in every attempt of
a Spark task, so a retried task stores nothing twice: as an idempotent producer's push
(no time window) in a streaming sink, else with a ``request_id`` (remembered for
``dedupe_seconds``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from . import _core
from ._core import OptionError, Span
from ._gateway import Gateway

log = logging.getLogger(__name__)

SCHEMA = StructType(
    [
        StructField("queue", StringType(), True),
        StructField("id", LongType(), True),
        StructField("payload", BinaryType(), True),
        StructField("kind", StringType(), True),
        StructField("headers", MapType(StringType(), StringType(), True), True),
        StructField("timestamp", TimestampType(), True),
    ]
)
JSON_FIELD = StructField("json", StringType(), True)

_ARROW_HEADERS = pa.map_(pa.string(), pa.string())
_ARROW_TIME = pa.timestamp("us", tz="UTC")


def _schema(decode_json: bool) -> StructType:
    return StructType([*SCHEMA.fields, JSON_FIELD]) if decode_json else SCHEMA


class BusDataSource(DataSource):
    """``spark.read.format("busmq")``: see the module docs of :mod:`busmq.spark` for options."""

    @classmethod
    def name(cls) -> str:
        return "busmq"

    def schema(self) -> StructType:
        # Called when a read is defined (``load()``): check what needs no Redis now.
        _check_read_options(self.options)
        return _schema(_core.parse_bool(self.options, "decode_json"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return BusReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BusStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BusWriter(_write_config(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return BusStreamWriter(_write_config(self.options, schema, overwrite, streaming=True))


# -- reading ---------------------------------------------------------------------------


class SpanPartition(InputPartition):
    """One queue's ids ``low..high`` on its shard (``None``: nothing to read)."""

    def __init__(self, span: Span | None) -> None:
        super().__init__(span)
        self.span = span


def _batches(span: Span | None, decode_json: bool) -> Iterator[pa.RecordBatch]:
    if span is None:
        return
    names = _schema(decode_json).fieldNames()
    for page in _core.read_pages(span):
        n = len(page.ids)
        columns = [
            pa.array([span.queue] * n, pa.string()),
            pa.array(page.ids, pa.int64()),
            pa.array(page.payloads, pa.binary()),
            pa.array(page.kinds, pa.string()),
            pa.array(page.headers, _ARROW_HEADERS),
            pa.array([ms * 1000 for ms in page.stamps], _ARROW_TIME),
        ]
        if decode_json:
            columns.append(pa.array(page.json, pa.string()))
        yield pa.RecordBatch.from_arrays(columns, names=names)


def _partitions(spans: Sequence[Span]) -> list[InputPartition]:
    # Spark needs at least one partition even when there is nothing to read.
    return [SpanPartition(s) for s in spans] or [SpanPartition(None)]


def _check_read_options(options: Mapping[str, str]) -> None:
    if Gateway.from_options(options) is None:
        _core.parse_urls(options)
    _core.parse_queues(options)
    _core.parse_int(options, "partition_size", _core.DEFAULT_CHUNK, 1)
    start = _core.parse_int(options, "start_id", None, 0)
    end = _core.parse_int(options, "end_id", None, 0)
    if start is not None and end is not None and start > end:
        raise OptionError(f"option 'start_id' ({start}) is greater than 'end_id' ({end})")
    _core.parse_choice(options, "starting", ("earliest", "latest"))
    _core.parse_int(options, "max_rows_per_trigger", _core.DEFAULT_MAX_ROWS_PER_TRIGGER, 1)
    _core.parse_bool(options, "fail_on_data_loss", True)


class _Source:
    """Options shared by the batch and the streaming reader, checked in the driver. The
    queues are read on their Redis shards, or through a gateway (``gateway_url``)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.decode_json = _core.parse_bool(options, "decode_json")
        self.queues = _core.parse_queues(options)
        self.chunk = _core.parse_int(options, "partition_size", _core.DEFAULT_CHUNK, 1) or 1
        self.gateway = Gateway.from_options(options)
        if self.gateway is None:
            urls = _core.parse_urls(options)
            self.locations = {q: _core.locate_existing(urls, q) for q in self.queues}
        else:
            for queue in self.queues:
                self.gateway.require(queue)
            self.locations = dict.fromkeys(self.queues, self.gateway.url)

    def last_ids(self) -> dict[str, int]:
        return {q: self._last_id(q) for q in self.queues}

    def _last_id(self, queue: str) -> int:
        if self.gateway is not None:
            return self.gateway.last_id(queue)
        return _core.last_id(self.locations[queue], queue)

    def _first_id(self, queue: str) -> int | None:
        if self.gateway is not None:
            return self.gateway.first_id(queue)
        return _core.first_id(self.locations[queue], queue)

    def _dropped_through(self, queue: str) -> int:
        if self.gateway is not None:
            return self.gateway.dropped_through(queue)
        return _core.dropped_through(self.locations[queue], queue)

    def _spans(self, queue: str, low: int, high: int) -> list[Span]:
        return _core.split(self.locations[queue], queue, low, high, self.chunk, self.gateway)


class BusReader(_Source, DataSourceReader):
    """Batch read of ids ``start_id..end_id`` (inclusive) of each queue, as of planning."""

    def __init__(self, options: Mapping[str, str]) -> None:
        _check_read_options(options)
        start = _core.parse_int(options, "start_id", None, 0)
        end = _core.parse_int(options, "end_id", None, 0)
        super().__init__(options)
        self.spans: list[Span] = []
        for queue in self.queues:
            first = self._first_id(queue)
            if first is None:
                continue
            last = self._last_id(queue)
            low = max(start or 1, first)
            high = last if end is None else min(end, last)
            if low <= high:
                self.spans += self._spans(queue, low, high)

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(self.spans)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpanPartition)
        return _batches(partition.span, self.decode_json)


class BusStreamReader(_Source, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of new messages; offsets are ``{queue: last id read}``."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.starting = _core.parse_choice(options, "starting", ("earliest", "latest"))
        self.max_rows = (
            _core.parse_int(options, "max_rows_per_trigger", _core.DEFAULT_MAX_ROWS_PER_TRIGGER, 1)
            or 1
        )
        self.fail_on_data_loss = _core.parse_bool(options, "fail_on_data_loss", True)
        super().__init__(options)
        self.target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        if self.starting == "latest":
            return self.last_ids()
        return dict.fromkeys(self.queues, 0)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.last_ids()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        begin = _core.parse_offset(start, self.queues)
        latest = self.target if self.target is not None else self.last_ids()
        if isinstance(limit, ReadAllAvailable):
            return {q: max(begin[q], latest[q]) for q in self.queues}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
        return _core.bounded_end(begin, latest, budget)

    def reportLatestOffset(self) -> dict[str, int]:
        return self.last_ids()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = _core.parse_offset(start, self.queues)
        finish = _core.parse_offset(end, self.queues)
        spans: list[Span] = []
        for queue in self.queues:
            if finish[queue] > begin[queue]:
                low = self._first_readable(queue, begin[queue])
                spans += self._spans(queue, low, finish[queue])
        return _partitions(spans)

    def _first_readable(self, queue: str, offset: int) -> int:
        """The first id to read after ``offset``. If the queue's retention dropped ids
        after it that this query had not read, that is data loss: an error, or with
        ``fail_on_data_loss=false`` a warning and the read goes on after them. (Ids
        dropped before a query started from ``earliest`` were never its to read.)"""
        if offset == 0:
            return 1
        dropped = self._dropped_through(queue)
        if dropped <= offset:
            return offset + 1
        lost = f"ids {offset + 1} to {dropped} of queue {queue!r}"
        if self.fail_on_data_loss:
            raise _core.DataLossError(
                f"{lost} were dropped by the queue's retention before this query read them; "
                "set option fail_on_data_loss=false to skip what was dropped"
            )
        log.warning("busmq source: skipping %s, dropped by the queue's retention", lost)
        return dropped + 1

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpanPartition)
        return _batches(partition.span, self.decode_json)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: reads are non-destructive."""


# -- writing ---------------------------------------------------------------------------


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


def _write_config(
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
            _, duplicate = push(flat, request_id, producer)
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
