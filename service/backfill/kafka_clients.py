"""The backfill's Kafka clients, all built from the stage's settings (service.kafka.config).

Nothing connects until used: constructors do no network I/O.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from service.backfill import progress
from service.backfill.progress import JobState
from service.kafka.config import Config, admin_config, consumer_config
from service.observability.logs import librdkafka_logger
from service.settings import Settings


def admin(settings: Settings) -> AdminClient:
    config: Config = {**admin_config(settings), "logger": librdkafka_logger("backfill")}
    return AdminClient(config)


def progress_consumer(settings: Settings) -> Consumer:
    """read_committed, never joins its group nor commits: it only reads the progress topic
    by assignment, and needs end-of-partition events to know where the end is."""
    return Consumer({**consumer_config(settings), "enable.partition.eof": True,
                     "logger": librdkafka_logger("backfill")})


def range_consumer(settings: Settings) -> Consumer:
    """A progress consumer for a range of input assigned at its first offset. Offsets
    that retention deleted are an error, not a jump: librdkafka's reset to the log start
    (the stage's ``auto.offset.reset``) would read on from there, and the slice would be
    marked done with its head missing (docs/backfill.md, "History must stay")."""
    return Consumer({**consumer_config(settings), "enable.partition.eof": True,
                     "auto.offset.reset": "error", "logger": librdkafka_logger("backfill")})


def watermark_consumer(settings: Settings) -> Consumer:
    """Asks for the high watermark only, which read_committed would report as the last
    stable offset; it never reads a record, so read_uncommitted cannot leak anything."""
    return Consumer({**consumer_config(settings), "isolation.level": "read_uncommitted",
                     "logger": librdkafka_logger("backfill")})


def fetch_error(error: KafkaError) -> KafkaException:
    """librdkafka's own exception for a message's error: a slice's fetch error fails its
    Spark task as librdkafka raised it, and Spark retries the task."""
    return KafkaException(error)


def read_job(settings: Settings, topic: str, job_id: str) -> JobState:
    """A job's plan and committed slice progress, as of now (see progress.read_job)."""
    watermarks = watermark_consumer(settings)
    try:
        low, high = progress.watermarks(watermarks, topic)
    finally:
        watermarks.close()
    consumer = progress_consumer(settings)
    try:
        return progress.read_job(consumer, topic, job_id, high, low_watermark=low)
    finally:
        consumer.close()


def first_unread(settings: Settings, topic: str, partition: int, start: int, end: int,
                 timeout_s: float = 60.0) -> int | None:
    """The offset of the first record a read_committed reader gets from ``start`` that
    lies below ``end``, or None when nothing readable is left in ``[start, end)`` (only
    transaction markers, aborted or compacted-away records). When the last stable
    offset is below ``end`` (a transaction still open in the range) the answer is that
    offset: what lies beyond it cannot be known yet. Raises KafkaException on errors
    and TimeoutError when Kafka does not answer within ``timeout_s``."""
    consumer = progress_consumer(settings)  # read_committed, reports the partition's end
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            message = consumer.poll(min(left, 1.0))
            if message is None:
                continue
            error = message.error()
            if error is None:
                offset = message.offset()
                return offset if offset is not None and offset < end else None
            if error.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(error)
            at = message.offset()  # the end for read_committed: the last stable offset
            return None if at is None or at >= end else at
        raise TimeoutError(f"{topic}/{partition}: no answer from offset {start} within "
                           f"{timeout_s:.0f} s")
    finally:
        consumer.close()
