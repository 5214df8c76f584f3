"""Reading topics and offsets back, the way the exactly-once checks need them.

Plain functions over a bootstrap string, so they work against any broker (the session
broker, a 3-node test cluster, or ``make kafka-up``). Records come back as plain frozen
dataclasses, not librdkafka ``Message`` objects, so tests can compare and print them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from service.kafka.reading import EARLIEST, OffsetReader, list_offsets

__all__ = [
    "Isolation",
    "ReadRecord",
    "committed_offsets",
    "end_offsets",
    "partitions_of",
    "read_committed",
    "read_topic",
    "read_uncommitted",
    "start_offsets",
]

Isolation = Literal["read_committed", "read_uncommitted"]


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """One record as a consumer saw it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or ``None``."""
        found = [value for key, value in self.headers if key == name]
        return found[-1] if found else None


def _bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _position(message: Message) -> tuple[int, int]:
    """(partition, offset) of a consumed message or EOF event: both are always set."""
    partition, offset = message.partition(), message.offset()
    assert partition is not None and offset is not None, message
    return partition, offset


def _record(message: Message) -> ReadRecord:
    partition, offset = _position(message)
    raw = message.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    return ReadRecord(
        topic=message.topic() or "",
        partition=partition,
        offset=offset,
        key=_bytes(message.key()),
        value=_bytes(message.value()),
        headers=[(name, _bytes(value) or b"") for name, value in pairs],
        timestamp=message.timestamp()[1],
    )


def partitions_of(bootstrap: str, topic: str, *, timeout: float = 10.0) -> list[int]:
    """The partition ids of ``topic``; raises :class:`KafkaException` if it does not exist."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(topic, timeout=max(0.5, deadline - time.monotonic()))
        described = metadata.topics.get(topic)
        error = described.error if described is not None else None
        if described is not None and error is None and described.partitions:
            return sorted(described.partitions)
        if time.monotonic() > deadline:
            raise KafkaException(
                error or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no topic {topic!r}")
            )
        time.sleep(0.1)


def end_offsets(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    timeout: float = 10.0,
) -> dict[int, int]:
    """partition -> end offset: the last stable offset (LSO) for ``read_committed``, the
    high watermark for ``read_uncommitted``. An open transaction holds the LSO back."""
    wanted = [(topic, p) for p in partitions_of(bootstrap, topic, timeout=timeout)]
    with OffsetReader({"bootstrap.servers": bootstrap}) as reader:
        found = reader.end_offsets(wanted, stable=isolation == "read_committed",
                                   timeout_s=timeout)
    return {partition: offset for (_, partition), offset in found.items()}


def start_offsets(bootstrap: str, topic: str, *, timeout: float = 10.0) -> dict[int, int]:
    """partition -> log start offset (the first offset still readable)."""
    wanted = [(topic, p) for p in partitions_of(bootstrap, topic, timeout=timeout)]
    found = list_offsets({"bootstrap.servers": bootstrap}, wanted, EARLIEST,
                         IsolationLevel.READ_UNCOMMITTED)
    return {partition: offset for (_, partition), offset in found.items()}


def committed_offsets(
    bootstrap: str,
    group: str,
    topic: str,
    *,
    require_stable: bool = True,
    timeout: float = 10.0,
) -> dict[int, int]:
    """partition -> committed offset of ``group`` on ``topic``; partitions the group never
    committed are absent.

    With ``require_stable`` (the default) offsets sent in a still-open transaction make
    the broker answer UNSTABLE_OFFSET_COMMIT, asked again until the transaction ends or
    ``timeout`` passes (then :class:`KafkaException`).
    """
    wanted = [(topic, p) for p in partitions_of(bootstrap, topic, timeout=timeout)]
    with OffsetReader({"bootstrap.servers": bootstrap}, group, stable=require_stable) as reader:
        found = reader.committed(wanted, timeout_s=timeout)
    return {partition: offset for (_, partition), offset in found.items() if offset >= 0}


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    expected: int | None = None,
    timeout: float = 30.0,
) -> list[ReadRecord]:
    """Every record of ``topic`` from the beginning up to its end offsets, in partition,
    offset order.

    The end is :func:`end_offsets` for ``isolation`` taken when reading starts (with
    ``read_committed`` that is the last stable offset, so records of an open transaction
    and anything after them are not waited for). With ``expected``, end offsets are
    re-read until at least that many records arrived; if ``timeout`` passes first, what
    was read is returned for the caller's assertion to show. Without ``expected``, not
    reaching the end offsets in time raises :class:`TimeoutError`.
    """
    deadline = time.monotonic() + timeout
    targets = end_offsets(bootstrap, topic, isolation=isolation, timeout=timeout)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txstage-reader-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
        }
    )
    records: list[ReadRecord] = []
    # Absolute start offsets: a logical OFFSET_BEGINNING costs librdkafka a 500 ms retry
    # timer when the assignment comes before the partition's leader is known.
    positions = start_offsets(bootstrap, topic, timeout=timeout)
    try:
        # Metadata first: librdkafka otherwise may learn the leaders only on its 1 s scan.
        consumer.list_topics(topic, timeout=max(1.0, deadline - time.monotonic()))
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in positions.items()])
        while True:
            if all(positions[p] >= end for p, end in targets.items()):
                if expected is None or len(records) >= expected:
                    break
                targets = end_offsets(bootstrap, topic, isolation=isolation, timeout=timeout)
            if time.monotonic() > deadline:
                if expected is not None:
                    break
                raise TimeoutError(
                    f"read {len(records)} records of {topic!r}: positions {positions}, "
                    f"end offsets ({isolation}) {targets}"
                )
            _poll_into(consumer, records, positions)
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))


def _poll_into(consumer: Consumer, records: list[ReadRecord], positions: dict[int, int]) -> None:
    # consume() waits out its timeout unless the batch fills: keep it short.
    for message in consumer.consume(num_messages=500, timeout=0.05):
        error = message.error()
        if error is None:
            records.append(_record(message))
            partition, offset = _position(message)
            positions[partition] = offset + 1
        elif error.code() == KafkaError._PARTITION_EOF:
            # Aborted records and transaction markers are skipped without being delivered:
            # the EOF offset is the only sign the fetch position moved past them.
            partition, offset = _position(message)
            positions[partition] = max(positions[partition], offset)
        else:
            raise KafkaException(error)


def read_committed(
    bootstrap: str, topic: str, *, expected: int | None = None, timeout: float = 30.0
) -> list[ReadRecord]:
    """:func:`read_topic` with ``isolation.level=read_committed``."""
    return read_topic(
        bootstrap, topic, isolation="read_committed", expected=expected, timeout=timeout
    )


def read_uncommitted(
    bootstrap: str, topic: str, *, expected: int | None = None, timeout: float = 30.0
) -> list[ReadRecord]:
    """:func:`read_topic` with ``isolation.level=read_uncommitted`` (aborted records too)."""
    return read_topic(
        bootstrap, topic, isolation="read_uncommitted", expected=expected, timeout=timeout
    )
