"""The backfill's Kafka clients, all built from the stage's settings (service.kafka_config).

Nothing connects until used: constructors do no network I/O.
"""

from __future__ import annotations

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from service.backfill import progress
from service.backfill.progress import JobState
from service.kafka_config import admin_config, consumer_config
from service.settings import Settings


def admin(settings: Settings) -> AdminClient:
    return AdminClient(admin_config(settings))


def progress_consumer(settings: Settings) -> Consumer:
    """read_committed, never joins its group nor commits: it only reads the progress topic
    by assignment, and needs end-of-partition events to know where the end is."""
    return Consumer({**consumer_config(settings), "enable.partition.eof": True})


def watermark_consumer(settings: Settings) -> Consumer:
    """Asks for the high watermark only, which read_committed would report as the last
    stable offset; it never reads a record, so read_uncommitted cannot leak anything."""
    return Consumer({**consumer_config(settings), "isolation.level": "read_uncommitted"})


def read_job(settings: Settings, topic: str, job_id: str) -> JobState:
    """A job's plan and committed slice progress, as of now (see progress.read_job)."""
    watermarks = watermark_consumer(settings)
    try:
        high = progress.high_watermark(watermarks, topic)
    finally:
        watermarks.close()
    consumer = progress_consumer(settings)
    try:
        return progress.read_job(consumer, topic, job_id, high)
    finally:
        consumer.close()
