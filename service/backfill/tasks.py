"""What runs inside Spark tasks (Python workers): reading, the transform, the slice writes.

Functions here are shipped by reference (module path), so executors need ``service`` and
the transform's module importable, exactly like the stream. They get everything else
from the frozen, picklable objects below; the transform is loaded once per worker.

A Kafka source reaches a task as slice indexes only (sources.slice_indexes): the task
reads each slice itself (slice_reader). A file source reaches it as rows (rows.INPUT_DDL).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from service.backfill import kafka_clients, rows, slice_reader
from service.backfill.plan import Slice, transactional_id
from service.backfill.progress import SliceProgress
from service.backfill.slice_writer import Process, Read, SliceOutcome, SliceTask, SliceWriter
from service.backfill.topic_map import TopicMap, UnmappedTopicError
from service.contract.processing import process
from service.contract.records import Record
from service.formats.load import load_formatted
from service.kafka.cluster import Cluster, OutputLimits
from service.kafka.config import admin_config, producer_config
from service.kafka.producer import PinnedProducer
from service.observability import interpreter
from service.preflight import sized_max_bytes, told_max_bytes
from service.settings import Settings


@dataclass(frozen=True, slots=True)
class Processing:
    """How process() is called: the same arguments the stream passes.

    With ``settings`` (a Kafka sink) output sizes are checked against each topic's
    ``max.message.bytes`` exactly as the stage does (service.kafka.cluster.OutputLimits, one
    AdminClient per worker); without (a Parquet sink) against ``max_bytes`` only.
    ``max_bytes``: the size outputs are checked against (``max_bytes()``).
    """

    transform: str  # module.path:function
    default_topic: str
    dlq_topic: str | None
    max_bytes: int
    settings: Settings | None = None
    topics: TopicMap = field(default_factory=lambda: TopicMap(strict=False))


@dataclass(frozen=True, slots=True)
class KafkaSinkJob:
    processing: Processing
    settings: Settings
    job_id: str
    id_prefix: str
    progress_topic: str
    transaction_records: int
    transaction_ms: int
    transaction_bytes: int
    slices: dict[int, Slice]

    def slice_task(self, index: int) -> SliceTask:
        return SliceTask(self.slices[index], self.job_id,
                         transactional_id(self.id_prefix, self.job_id, index),
                         self.progress_topic, self.transaction_records, self.transaction_ms,
                         self.transaction_bytes)


@dataclass(frozen=True, slots=True)
class KafkaInput:
    """Where a task reads a Kafka source's slices from."""

    settings: Settings
    slices: dict[int, Slice]

    def reader(self, index: int) -> Read:
        piece = self.slices[index]
        return functools.partial(slice_reader.read_range, self.settings, piece.topic,
                                 piece.partition, end=piece.end)


def slice_indexes(batches: Iterable[pa.RecordBatch]) -> Iterator[int]:
    """The slice indexes of a task's rows (sources.slice_indexes)."""
    for batch in batches:
        yield from batch.column("slice").to_pylist()


_transforms: dict[str, Any] = {}  # per worker process, by reference


def _transform(spec: Processing) -> Any:
    if spec.transform not in _transforms:
        _transforms[spec.transform] = load_formatted(spec.transform, spec.settings,
                                                     spec.topics.live(spec.default_topic))
    return _transforms[spec.transform]


# Per worker process (Spark reuses it across tasks and jobs), by bootstrap servers and
# the producers' size, which differs between jobs.
_limits: dict[tuple[str, int], OutputLimits] = {}


def _max_bytes(spec: Processing) -> Callable[[str], int]:
    if spec.settings is None:
        return lambda _topic: spec.max_bytes
    key = (spec.settings.bootstrap_servers, spec.max_bytes)
    if key not in _limits:
        _limits[key] = OutputLimits(Cluster(admin_config(spec.settings)), spec.max_bytes)
    return _limits[key].lookup  # per output, as the stage's: the dict's own lookup


def processor(spec: Processing) -> Process:
    """The stream's ``process`` for a task (on a Spark worker, whose interpreter is
    tuned as the stage's is, once)."""
    interpreter.tune_gc()
    return spec.topics.applied(functools.partial(
        process, _transform(spec), default_topic=spec.default_topic,
        dlq_topic=spec.dlq_topic, max_bytes=_mapped_limits(spec)))


def _mapped_limits(spec: Processing) -> Callable[[str], int]:
    """Each output's limit is its sink topic's (the one it is written to)."""
    limits = _max_bytes(spec)
    if not spec.topics.named and not spec.topics.suffix:
        return limits
    topics = spec.topics

    def limit(topic: str) -> int:
        try:
            return limits(topics(topic))
        except UnmappedTopicError:
            return spec.max_bytes  # refused once the outputs are mapped
    return limit


UNLIMITED = 1 << 62  # no size applies


def max_bytes(settings: Settings | None, *, kafka_sink: bool) -> int:
    """The producers' ``message.max.bytes``, on the driver. A Kafka sink's is the stage's
    (preflight.sized_max_bytes) from the sink's default output and dead-letter topics,
    after the topic map (``settings`` names them), so a record the stream writes whole
    the backfill writes whole. A Parquet sink has no producer and its rows hold any
    size: only a size the user set for the producers applies (as it does to the
    stream's), else none."""
    if settings is None:
        return UNLIMITED
    if kafka_sink:
        return sized_max_bytes(settings, Cluster(admin_config(settings)))
    told = told_max_bytes(settings)
    return UNLIMITED if told is None else told


class Counters:
    """Spark accumulators of the Parquet sink: what successful task attempts did."""

    def __init__(self, context: Any) -> None:
        self.inputs, self.outputs, self.dead = (context.accumulator(0) for _ in range(3))

    def add(self, inputs: int, outputs: int, dead: int) -> None:
        self.inputs.add(inputs)
        self.outputs.add(outputs)
        self.dead.add(dead)

    def values(self) -> tuple[int, int, int]:
        return int(self.inputs.value), int(self.outputs.value), int(self.dead.value)


OUTPUT_BATCH = 10_000  # output rows per Arrow batch handed back to Spark


def transform_to_rows(spec: Processing, counters: Counters,
                      batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the Parquet sink from files: inputs → output rows (a poison
    record with no dead-letter topic raises, failing the task and so the job: nothing
    is written)."""
    for batch in batches:
        yield from _output_batches(spec, counters,
                                   (record for _, record in rows.sliced_records([batch])))


def read_to_rows(source: KafkaInput, spec: Processing, counters: Counters,
                 batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the Parquet sink from Kafka: each slice read, transformed."""
    for index in slice_indexes(batches):
        piece = source.slices[index]
        yield from _output_batches(spec, counters, source.reader(index)(piece.start))


def _output_batches(spec: Processing, counters: Counters,
                    records: Iterable[Record]) -> Iterator[pa.RecordBatch]:
    run = processor(spec)
    out: list[dict[str, Any]] = []
    inputs = dead = 0
    for record in records:
        result = run(record)
        out.extend(rows.output_row(o, record, i) for i, o in enumerate(result.outputs))
        inputs += 1
        dead += int(result.dead_lettered)
        if len(out) >= OUTPUT_BATCH:
            counters.add(inputs, len(out), dead)
            yield rows.output_batch(out)
            out, inputs, dead = [], 0, 0
    counters.add(inputs, len(out), dead)
    yield rows.output_batch(out)


def write_kafka_slices(job: KafkaSinkJob,
                       batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the Kafka sink from files: each slice in this task, in turn."""
    grouped = itertools.groupby(rows.sliced_records(batches), key=operator.itemgetter(0))
    for index, group in grouped:
        records = (record for _, record in group)
        outcome = write_slice(job, index, functools.partial(_given, records))
        yield rows.summary_batch(summary(index, outcome))


def _given(records: Iterable[Record], _start: int) -> Iterable[Record]:
    return records  # rows from Spark: the writer skips those below its progress


def read_kafka_slices(source: KafkaInput, job: KafkaSinkJob,
                      batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the Kafka sink from Kafka: each slice read from its committed
    progress, transformed and written, in turn."""
    for index in slice_indexes(batches):
        outcome = write_slice(job, index, source.reader(index))
        yield rows.summary_batch(summary(index, outcome))


def slice_writer(job: KafkaSinkJob, index: int) -> SliceWriter:
    """A writer for one attempt at slice ``index``, with its own pinned producer."""
    task = job.slice_task(index)
    piece, settings = task.piece, job.settings
    # Sized as the outputs are checked (Processing.max_bytes), as the stage's producers.
    config = producer_config(settings, task.transactional_id,
                             message_max_bytes=job.processing.max_bytes)
    producer = PinnedProducer(config, piece.topic, piece.partition,
                              deadline_s=settings.transaction_timeout_ms / 1000 + 30,
                              connect_first=True)

    def committed() -> SliceProgress | None:
        state = kafka_clients.read_job(settings, job.progress_topic, job.job_id)
        return state.slices.get(index)

    def unread(start: int) -> int | None:
        return kafka_clients.first_unread(settings, piece.topic, piece.partition, start,
                                          piece.end)

    return SliceWriter(task, producer, committed, processor(job.processing),
                       dlq_topic=job.processing.dlq_topic, unread=unread,
                       max_bytes=_mapped_limits(job.processing))


def write_slice(job: KafkaSinkJob, index: int, read: Read) -> SliceOutcome:
    writer = slice_writer(job, index)
    try:
        return writer.run(read)
    finally:
        writer.producer.close()


def summary(index: int, outcome: SliceOutcome) -> dict[str, int]:
    return {"slice": index, "skipped": outcome.skipped, "records": outcome.records,
            "outputs": outcome.outputs, "dead_lettered": outcome.dead_lettered,
            "transactions": outcome.transactions, "aborts": outcome.aborts}
