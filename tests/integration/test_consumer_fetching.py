"""The input consumer keeps fetching while it works through a full prefetch queue.

librdkafka stops fetching a partition for ``fetch.queue.backoff.ms`` once the
prefetched records reach ``queued.max.messages.kbytes``. Its default, 1 s, is longer
than a replica takes to work through its 64 MB queue, so every replica (and the bare
loop of the benchmark) stood idle part of every second: throughput was capped near
70k records/s of 1 KB (docs/journal/2026-11-26-fetch-backoff-and-runs.md). Here the
queue holds 100 KB, so every fetch (up to 1 MB) fills it and the stall comes after
each one: 20.4 s for the 20 MB below with librdkafka's default, 0.7 s with the stage's.
The operator tools' reader (``txstage audit``, ``txstage redrive``) fetches the same way.

Takes ≈ 1 s (2 cores; make test, 2026-11-28).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from service.kafka import reading
from service.kafka.config import consumer_config
from service.settings import load_settings
from tests.harness.kafka import KafkaService

RECORDS = 20_000
VALUE = b"v" * 1000


def _filled(kafka: KafkaService, new_topic: Callable[..., str]) -> str:
    topic = new_topic(partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20})
    for _ in range(RECORDS):
        producer.produce(topic, VALUE)
        producer.poll(0)
    assert producer.flush(30) == 0
    return topic


def test_a_full_prefetch_queue_does_not_stall_the_input_consumer(
        kafka: KafkaService, new_topic: Callable[..., str], group_id: str) -> None:
    topic = _filled(kafka, new_topic)
    settings = load_settings({
        "TXSTAGE_BOOTSTRAP_SERVERS": kafka.bootstrap, "TXSTAGE_GROUP_ID": group_id,
        "TXSTAGE_INPUT_TOPICS": topic, "TXSTAGE_OUTPUT_TOPIC": "unused",
        "TXSTAGE_TRANSFORM": "service.examples.square:square",
        "TXSTAGE_CONSUMER__QUEUED_MAX_MESSAGES_KBYTES": "100"})  # full after any fetch
    consumer = Consumer(consumer_config(settings))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        first = consumer.consume(1, 30)
        assert first, "nothing fetched in 30 s"
        started, count = time.monotonic(), len(first)
        while count < RECORDS and time.monotonic() - started < 60:
            # (records only: the input consumer also reports each partition's end)
            count += sum(1 for msg in consumer.consume(500, 0.2) if msg.error() is None)
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    assert count == RECORDS
    # About 20 queue-fulls: with librdkafka's 1 s backoff this took 20 s.
    assert elapsed < 5, f"{RECORDS} records of 1 KB took {elapsed:.1f} s to consume"


def test_a_full_prefetch_queue_does_not_stall_the_operator_tools_reader(
        kafka: KafkaService, new_topic: Callable[..., str], group_id: str) -> None:
    topic = _filled(kafka, new_topic)
    config = {"bootstrap.servers": kafka.bootstrap, "queued.max.messages.kbytes": 100}
    started = time.monotonic()
    count = reading.read(config, group_id, {(topic, 0): (0, RECORDS)}, lambda msg: None,
                         timeout_s=60)
    elapsed = time.monotonic() - started
    assert count == RECORDS
    assert elapsed < 5, f"{RECORDS} records of 1 KB took {elapsed:.1f} s to read"
