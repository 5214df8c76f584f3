"""Where a job's plan and each slice's committed progress live: a compacted Kafka topic.

Why a topic and not transactional consumer-group offsets: a slice of a file source has
no Kafka partition to commit an offset for (brokers refuse offsets of unknown topics),
several slices may share one input partition, and group offsets expire
(``offsets.retention.minutes``) where a compacted topic keeps the last value per key.

Records, all in partition 0 (so adding partitions later never moves a key), JSON values:

    plan/<job_id>            the Plan, written once by the driver before any slice runs
    slice/<job_id>/<index>   SliceProgress, produced by the slice's transactional producer
                             in the same transaction as the outputs it accounts for

Reading is read_committed up to the high watermark taken when the read starts: another
slice's open transaction holds the last stable offset back, and stopping there could miss
this slice's own latest progress. The read waits for such transactions to finish.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from confluent_kafka import (
    KafkaError,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from service.backfill.plan import Plan, Slice
from service.errors import Where
from service.kafka.errors import translate_error, translated
from service.kafka.topics import create_topic

PARTITION = 0
VERSION = 1


@dataclass(frozen=True, slots=True)
class SliceProgress:
    """What one slice has committed: the next input offset and running totals."""

    index: int
    start: int  # the slice as planned, to catch a plan mismatch
    end: int
    next_offset: int  # every input below it is written (or dead-lettered)
    records_in: int = 0
    outputs: int = 0
    dead_lettered: int = 0
    done: bool = False

    @classmethod
    def initial(cls, piece: Slice) -> SliceProgress:
        return cls(piece.index, piece.start, piece.end, piece.start)

    def advanced(self, next_offset: int, records: int, outputs: int, dead: int,
                 done: bool = False) -> SliceProgress:
        return replace(self, next_offset=next_offset, records_in=self.records_in + records,
                       outputs=self.outputs + outputs, dead_lettered=self.dead_lettered + dead,
                       done=done)


@dataclass(slots=True)
class JobState:
    plan: Plan | None = None
    definition: dict[str, Any] = field(default_factory=dict)
    planned_at_ms: int = 0
    slices: dict[int, SliceProgress] = field(default_factory=dict)

    def done(self) -> bool:
        return self.plan is not None and all(
            self.slices.get(s.index, SliceProgress.initial(s)).done for s in self.plan.slices)


def plan_key(job_id: str) -> bytes:
    return f"plan/{job_id}".encode()


def slice_key(job_id: str, index: int) -> bytes:
    return f"slice/{job_id}/{index}".encode()


def encode_plan(plan: Plan, definition: dict[str, Any], now_ms: int) -> bytes:
    doc = {"v": VERSION, "planned_at_ms": now_ms, "definition": definition, **plan.to_json()}
    return json.dumps(doc, sort_keys=True).encode()


def encode_progress(progress: SliceProgress) -> bytes:
    return json.dumps({"v": VERSION, **asdict(progress)}, sort_keys=True).encode()


def apply(state: JobState, job_id: str, key: bytes | None, value: bytes | None) -> None:
    """Fold one progress-topic record into ``state`` (records of other jobs are ignored)."""
    if key is None or value is None:
        return
    name = key.decode(errors="replace")
    if name == f"plan/{job_id}":
        doc = json.loads(value)
        state.plan = Plan.from_json(doc)
        state.definition = dict(doc.get("definition", {}))
        state.planned_at_ms = int(doc.get("planned_at_ms", 0))
    elif name.startswith(f"slice/{job_id}/"):
        doc = json.loads(value)
        doc.pop("v", None)
        progress = SliceProgress(**doc)
        state.slices[progress.index] = progress


class ProgressConsumer(Protocol):
    """The part of confluent_kafka.Consumer a progress read uses."""

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]: ...

    def close(self) -> None: ...


def read_job(
    consumer: ProgressConsumer, topic: str, job_id: str, high_watermark: int,
    timeout_s: float = 120.0, *, low_watermark: int = 0,
) -> JobState:
    """Everything committed for ``job_id`` below ``high_watermark``.

    ``consumer`` must be read_committed with ``enable.partition.eof``; ``high_watermark``
    is the read_uncommitted end of the partition taken after any fencing that matters.
    The read starts at ``low_watermark``, an absolute offset: librdkafka resolves a
    logical OFFSET_BEGINNING with a ListOffsets request that, from a consumer not yet
    connected, waits for its 500 ms retry: the first record comes after 0.51 s,
    against 0.01 s from an absolute offset.
    """
    state = JobState()
    for key, value in _records(consumer, topic, low_watermark, high_watermark, timeout_s):
        apply(state, job_id, key, value)
    return state


def _records(consumer: ProgressConsumer, topic: str, low: int, high: int,
             timeout_s: float) -> Iterator[tuple[bytes | None, bytes | None]]:
    if high <= low:
        return
    consumer.assign([TopicPartition(topic, PARTITION, low)])
    deadline = time.monotonic() + timeout_s
    where = Where("consume", topic=topic, partition=PARTITION)
    position = low
    while True:
        # consume() returns before its timeout only with as many messages as asked for
        # (an end-of-partition event does not end the wait): ask for what is left.
        left = max(1, min(1000, high - position))
        for message in consumer.consume(left, timeout=0.01):
            error = message.error()
            if error is None:
                position = message.offset() + 1
                yield message.key(), message.value()
            elif error.code() != KafkaError._PARTITION_EOF:
                raise translate_error(error, where)
            elif message.offset() >= high:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"reading {topic}/{PARTITION} up to offset {high} took over {timeout_s:.0f} s: "
                f"a transaction on it stays open (a slice stalled past its commit?)"
            )


def watermarks(consumer: WatermarkConsumer, topic: str) -> tuple[int, int]:
    """The progress partition's first offset and its read_uncommitted end: every record
    a read must see lies between.

    ``consumer`` must be read_uncommitted (it only asks for the watermarks): a
    read_committed consumer reports the last stable offset as the end instead.
    """
    with translated(Where("get_watermark_offsets", topic=topic, partition=PARTITION)):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, PARTITION),
                                                   timeout=30.0, cached=False)
        return int(low), int(high)


class WatermarkConsumer(Protocol):
    def get_watermark_offsets(self, partition: TopicPartition, timeout: float = ...,
                              cached: bool = ...) -> tuple[int, int]: ...


def ensure_topic(admin: AdminClient, topic: str) -> None:
    """Create the progress topic (compacted, one partition) unless it exists."""
    create_topic(admin, topic, partitions=1, config={"cleanup.policy": "compact"})
