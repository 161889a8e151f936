"""The ``busmq`` PySpark data source: batch and streaming reads (the writers are in
:mod:`.sink`).

Reads are non-destructive (XRANGE on the queue's stream, or ``BrowseQueue`` through a
gateway: the replay semantics).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
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
from .sink import BusStreamWriter, BusWriter, write_config

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
        return BusWriter(write_config(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return BusStreamWriter(write_config(self.options, schema, overwrite, streaming=True))


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
