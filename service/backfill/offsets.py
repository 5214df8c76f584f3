"""Resolve a Kafka source range to fixed offsets per partition, in the driver, before Spark.

``earliest`` is the log start offset, ``latest`` the last stable offset (what a
read_committed consumer can see: no open transaction is cut in half), a timestamp the
first offset at or after it (or ``latest`` when there is none). The result is checked
against the log: a range below the log start was deleted by retention, a range past
the last stable offset cannot be read yet (Spark would wait and then fail).
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import IsolationLevel, KafkaError
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from service.backfill.plan import PartitionRange
from service.backfill.specs import Bound, Earliest, KafkaSource, Latest, Offsets, Timestamp
from service.errors import ConfigError, Where
from service.kafka import reading
from service.kafka.errors import translate_error, translated

TIMEOUT_S = 30.0


def resolve(admin: AdminClient, source: KafkaSource) -> list[PartitionRange]:
    """The committed offset range of each selected partition; ConfigError if impossible."""
    partitions = _partitions(admin, source)
    log_start = _list(admin, source.topic, partitions, reading.EARLIEST)
    stable = _list(admin, source.topic, partitions, reading.LATEST)
    start = _bound(admin, source.topic, source.start, partitions, log_start, stable)
    end = _bound(admin, source.topic, source.end, partitions, log_start, stable)
    problems = [problem for p in partitions
                for problem in _check(source, p, start[p], end[p], log_start[p], stable[p])]
    if problems:
        raise ConfigError(*problems)
    return [PartitionRange(source.topic, p, start[p], end[p]) for p in partitions]


def topic_partitions(admin: AdminClient, topic: str) -> list[int] | None:
    """The topic's partitions, or ``None`` when it does not exist."""
    with translated(Where("list_topics", topic=topic)):
        described = admin.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        if described is None:
            return None
        if described.error is not None:
            if described.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise translate_error(described.error, Where("list_topics", topic=topic))
        return sorted(described.partitions)


def _partitions(admin: AdminClient, source: KafkaSource) -> list[int]:
    existing = topic_partitions(admin, source.topic)
    if existing is None:
        raise ConfigError(f"source topic {source.topic!r} does not exist")
    named = source.partitions()
    if named is None:
        return existing
    missing = sorted(named - set(existing))
    if missing:
        raise ConfigError(f"source topic {source.topic!r} has no partition "
                          f"{', '.join(map(str, missing))} (it has {len(existing)})")
    return sorted(named)


def _list(admin: AdminClient, topic: str, partitions: list[int],
          spec: OffsetSpec) -> dict[int, int]:
    """``list_offsets`` read_committed (``latest`` is the last stable offset), asked
    again while a partition is not answered for (service.kafka.reading.offsets)."""
    with translated(Where("list_offsets", topic=topic)):
        found = reading.offsets(admin, [(topic, p) for p in partitions], spec,
                                IsolationLevel.READ_COMMITTED, timeout_s=TIMEOUT_S)
    return {p: offset for (_, p), offset in found.items()}


def _bound(admin: AdminClient, topic: str, bound: Bound, partitions: list[int],
           log_start: Mapping[int, int], stable: Mapping[int, int]) -> dict[int, int]:
    if isinstance(bound, Earliest):
        return dict(log_start)
    if isinstance(bound, Latest):
        return dict(stable)
    if isinstance(bound, Offsets):
        return {p: bound.by_partition.get(p, stable[p]) for p in partitions}
    assert isinstance(bound, Timestamp)
    found = _list(admin, topic, partitions, OffsetSpec.for_timestamp(bound.ms))
    # -1: no record at or after the timestamp, so the range runs to the end.
    return {p: stable[p] if offset < 0 else offset for p, offset in found.items()}


def _check(source: KafkaSource, partition: int, start: int, end: int,
           log_start: int, stable: int) -> list[str]:
    at = f"source {source.topic}/{partition}"
    if end < start:
        return [f"{at}: the range ends at offset {end}, before its start {start} "
                f"(from={source.start}, to={source.end})"]
    if start < log_start:
        return [f"{at}: offset {start} is below the log start offset {log_start}; "
                f"those records were deleted (retention): start at {log_start} or later"]
    if end > stable:
        return [f"{at}: offset {end} is past the last stable offset {stable}; "
                f"records there are not written or not committed yet"]
    return []
