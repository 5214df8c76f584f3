"""One slice's input read from Kafka inside its Spark task, with librdkafka.

The stream's own client and conversion (service.kafka.messages.to_record): read_committed,
by assignment (never joins the group, never commits), from the slice's committed
progress to its end. Nothing crosses to the JVM: Spark hands a task only slice
indexes, so a slice costs one consumer (milliseconds) instead of Spark's Java
consumer, and records reach the transform without an Arrow round trip.

The read stops at the first record at or beyond the slice's end, or at the partition's
end (the last stable offset, reported by ``enable.partition.eof``). Stopping short of
the end is not trusted either way: the slice writer asks Kafka whether a readable record
was left (service.backfill.slice_writer, "Done is checked").
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, TopicPartition

from service.backfill import kafka_clients
from service.contract.records import Record
from service.kafka.messages import to_record
from service.settings import Settings


class InputGoneError(RuntimeError):
    """Part of a slice's range was deleted (retention) before its task read it."""


BATCH = 1000  # messages per consume() call, at most
WAIT_S = 0.1  # per consume(): how late a gap (markers, aborted records) at the end is seen
IDLE_TIMEOUT_S = 60.0  # no message nor end-of-partition for this long: fail the task


def read_range(settings: Settings, topic: str, partition: int, start: int, end: int,
               *, idle_timeout_s: float = IDLE_TIMEOUT_S) -> Iterator[Record]:
    """The committed records of ``topic``/``partition`` in ``[start, end)``, in offset order.

    Raises KafkaException on a fetch error and TimeoutError when Kafka returns nothing
    for ``idle_timeout_s`` (Spark retries the task; the retry resumes from progress);
    InputGoneError when an offset of the range no longer exists (retention), which no
    retry mends: the job fails, as docs/backfill.md says."""
    if start >= end:
        return
    consumer = kafka_clients.range_consumer(settings)  # read_committed, reports the end
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        yield from _records(consumer, start, end, idle_timeout_s)
    finally:
        consumer.close()


def _records(consumer: Consumer, start: int, end: int,
             idle_timeout_s: float) -> Iterator[Record]:
    heard, expected = time.monotonic(), start
    while True:
        # consume() returns early only once it has as many messages as asked for, never
        # on an end-of-partition event: ask for no more than the range still holds.
        messages = consumer.consume(min(BATCH, end - expected), WAIT_S)
        if not messages:
            if time.monotonic() - heard > idle_timeout_s:
                raise TimeoutError(f"no record nor end of partition from Kafka within "
                                   f"{idle_timeout_s:.0f} s")
            continue
        heard = time.monotonic()
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return  # the last stable offset: nothing more is readable now
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise InputGoneError(
                        f"{message.topic()}/{message.partition()}: offset {expected} is no "
                        f"longer in Kafka (retention deleted it while the job ran): the "
                        f"range {start}..{end - 1} cannot be read whole ({error.str()})")
                raise kafka_clients.fetch_error(error)  # Spark retries the task
            offset: int = message.offset()  # type: ignore[assignment]
            if offset >= end:
                return
            yield to_record(message)
            expected = offset + 1
            if expected >= end:
                return
