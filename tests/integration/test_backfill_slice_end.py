"""Issue 12, defect 4: a backfill slice is "done" only once its whole range was read.

The slice writer asks ``kafka_clients.first_unread`` whether anything readable is left
between where its input stopped and the range's end (unit tests:
tests/unit/test_backfill_slice_writer.py). Here that question against the real broker:
transaction markers and aborted records are nothing left; a committed record is; and
an open transaction in the range makes the answer "not known yet" (its first offset).
No Spark.

Takes ≈ 1 s (2 cores; make test, 2026-11-28).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from service.backfill import config, kafka_clients
from service.backfill.slice_reader import InputGoneError, read_range
from service.backfill.specs import parse_sink, parse_source
from service.settings import Settings
from tests.harness.kafka import KafkaService
from tests.harness.reading import end_offsets
from tests.harness.stage import wait_for

pytestmark = pytest.mark.kafka

NewTopic = Callable[..., str]


def _settings(kafka: KafkaService, topic: str, job_id: str) -> Settings:
    """A backfill's Kafka settings reading ``topic`` (the sink is never written)."""
    return config.build(config.Flags(
        source=parse_source(f"kafka://{topic}"), sink=parse_sink("kafka://unused"),
        job_id=job_id, transform="service.examples.square:square",
        bootstrap_servers=kafka.bootstrap, dlq_topic=""), {}).kafka()


def test_first_unread_skips_markers_and_aborted_records_but_not_a_committed_one(
        kafka: KafkaService, new_topic: NewTopic, unique_name: Callable[[str], str]) -> None:
    topic = new_topic(partitions=1, prefix="in")
    settings = _settings(kafka, topic, unique_name("ends"))
    producer = Producer({"bootstrap.servers": kafka.bootstrap,
                         "transactional.id": unique_name("ends-tx")})
    producer.init_transactions(30)

    def transaction(values: list[bytes], commit: bool) -> None:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value, partition=0)
        producer.flush(30)  # written before the abort (an abort purges what is unsent)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
        # The markers are written after the call returns; a backfill's range always
        # ends at or below the last stable offset, so wait for it to pass them.
        high = end_offsets(kafka.bootstrap, topic, isolation="read_uncommitted")[0]
        wait_for(lambda: end_offsets(kafka.bootstrap, topic)[0] >= high, 10,
                 "the last stable offset to pass the markers")

    transaction([b"0", b"1", b"2", b"3", b"4"], commit=True)   # offsets 0-4, marker 5
    transaction([b"6", b"7", b"8"], commit=False)             # aborted 6-8, marker 9

    def first_unread(start: int, end: int) -> int | None:
        return kafka_clients.first_unread(settings, topic, 0, start, end, timeout_s=30)

    assert first_unread(5, 10) is None, "a marker, aborted records and a marker: nothing"
    assert first_unread(3, 10) == 3
    transaction([b"10"], commit=True)                          # offset 10, marker 11
    assert first_unread(5, 12) == 10, "a committed record after the aborted ones"
    assert first_unread(5, 10) is None, "the range ends before it"
    producer.begin_transaction()                               # open: offset 12 on
    producer.produce(topic, b"12", partition=0)
    producer.flush(30)
    try:
        assert first_unread(11, 14) == 12, "past the last stable offset nothing is known"
        assert first_unread(11, 12) is None
    finally:
        producer.abort_transaction(30)


def test_a_range_whose_head_retention_deleted_fails_instead_of_reading_on(
        kafka: KafkaService, new_topic: NewTopic, unique_name: Callable[[str], str]) -> None:
    # Review finding: the slice's reader was assigned at the range's first offset and,
    # those offsets gone, librdkafka reset it to the log start (auto.offset.reset
    # earliest) without an error; the slice was then marked done with its head missing.
    topic = new_topic(partitions=1, prefix="in")
    settings = _settings(kafka, topic, unique_name("gone"))
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(200):
        producer.produce(topic, str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    [deleted] = admin.delete_records([TopicPartition(topic, 0, 50)]).values()
    deleted.result(30)  # offsets 0-49 are gone, as retention would delete them
    with pytest.raises(InputGoneError, match=f"{topic}/0: offset 0 is no longer in Kafka"):
        list(read_range(settings, topic, 0, 0, 200, idle_timeout_s=20))
    assert [r.offset for r in read_range(settings, topic, 0, 50, 60)] == list(range(50, 60))
