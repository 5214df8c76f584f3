"""What runs inside Spark tasks (Python workers): the transform and the Kafka slice writes.

Functions here are shipped by reference (module path), so executors need ``service`` and
the transform's module importable, exactly like the stream. They get everything else
from the frozen, picklable objects below; the transform is loaded once per worker.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from service.admin import DEFAULT_MESSAGE_MAX_BYTES, Cluster, OutputLimits
from service.backfill import kafka_clients, rows
from service.backfill.plan import Slice, transactional_id
from service.backfill.progress import SliceProgress
from service.backfill.slice_writer import Process, SliceOutcome, SliceTask, SliceWriter
from service.checks import producer_max_bytes
from service.kafka_config import admin_config, producer_config
from service.processing import process
from service.producer import PinnedProducer
from service.records import Record
from service.settings import Settings
from service.transform import load_transform


@dataclass(frozen=True, slots=True)
class Processing:
    """How process() is called: the same arguments the stream passes.

    With ``settings`` (a Kafka sink) output sizes are checked against each topic's
    ``max.message.bytes`` exactly as the stage does (service.admin.OutputLimits, one
    AdminClient per worker); without (a Parquet sink) against ``max_bytes`` only.
    """

    transform: str  # module.path:function
    default_topic: str
    dlq_topic: str | None
    max_bytes: int
    settings: Settings | None = None


@dataclass(frozen=True, slots=True)
class KafkaSinkJob:
    processing: Processing
    settings: Settings
    job_id: str
    id_prefix: str
    progress_topic: str
    transaction_records: int
    transaction_ms: int
    slices: dict[int, Slice]

    def slice_task(self, index: int) -> SliceTask:
        return SliceTask(self.slices[index], self.job_id,
                         transactional_id(self.id_prefix, self.job_id, index),
                         self.progress_topic, self.transaction_records, self.transaction_ms)


@functools.cache
def _transform(ref: str) -> Any:
    return load_transform(ref)


_limits: dict[str, OutputLimits] = {}  # per worker process, by bootstrap servers


def _max_bytes(spec: Processing) -> Callable[[str], int]:
    if spec.settings is None:
        return lambda _topic: spec.max_bytes
    key = spec.settings.bootstrap_servers
    if key not in _limits:
        _limits[key] = OutputLimits(Cluster(admin_config(spec.settings)), spec.max_bytes)
    return _limits[key]


def processor(spec: Processing) -> Process:
    return functools.partial(process, _transform(spec.transform),
                             default_topic=spec.default_topic, dlq_topic=spec.dlq_topic,
                             max_bytes=_max_bytes(spec))


def max_bytes(settings: Settings | None) -> int:
    return producer_max_bytes(settings) if settings is not None else DEFAULT_MESSAGE_MAX_BYTES


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


def transform_to_rows(spec: Processing, counters: Counters,
                      batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the Parquet sink: inputs → output rows (a poison record with no
    dead-letter topic raises, failing the task and so the job: nothing is written)."""
    run = processor(spec)
    for batch in batches:
        out: list[dict[str, Any]] = []
        records = dead = 0
        for _, record in rows.sliced_records([batch]):
            result = run(record)
            out.extend(rows.output_row(o, record, i) for i, o in enumerate(result.outputs))
            records += 1
            dead += int(result.dead_lettered)
        counters.add(records, len(out), dead)
        yield rows.output_batch(out)


def write_kafka_slices(job: KafkaSinkJob,
                       batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the Kafka sink: each slice in this task, one after the other."""
    grouped = itertools.groupby(rows.sliced_records(batches), key=operator.itemgetter(0))
    for index, group in grouped:
        outcome = write_slice(job, index, (record for _, record in group))
        yield rows.summary_batch(summary(index, outcome))


def slice_writer(job: KafkaSinkJob, index: int) -> SliceWriter:
    """A writer for one attempt at slice ``index``, with its own pinned producer."""
    task = job.slice_task(index)
    piece, settings = task.piece, job.settings
    producer = PinnedProducer(producer_config(settings, task.transactional_id), piece.topic,
                              piece.partition,
                              deadline_s=settings.transaction_timeout_ms / 1000 + 30)

    def committed() -> SliceProgress | None:
        state = kafka_clients.read_job(settings, job.progress_topic, job.job_id)
        return state.slices.get(index)

    def unread(start: int) -> int | None:
        return kafka_clients.first_unread(settings, piece.topic, piece.partition, start,
                                          piece.end)

    return SliceWriter(task, producer, committed, processor(job.processing),
                       dlq_topic=job.processing.dlq_topic, unread=unread)


def write_slice(job: KafkaSinkJob, index: int, records: Iterable[Record]) -> SliceOutcome:
    writer = slice_writer(job, index)
    try:
        return writer.run(records)
    finally:
        writer.producer.close()


def summary(index: int, outcome: SliceOutcome) -> dict[str, int]:
    return {"slice": index, "skipped": outcome.skipped, "records": outcome.records,
            "outputs": outcome.outputs, "dead_lettered": outcome.dead_lettered,
            "transactions": outcome.transactions, "aborts": outcome.aborts}
