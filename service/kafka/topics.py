"""A topic by hand: created unless it exists (the stage's topics, the backfill's
progress topic, redrive's parking topic), lines written into it, its committed records
followed (``txstage topics``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from service.contract.processing import Produced
from service.errors import Where
from service.kafka.config import Config
from service.kafka.errors import kafka_error, translated
from service.kafka.producer import produce
from service.observability.logs import librdkafka_logger


def create_topic(admin: AdminClient, topic: str, *, partitions: int,
                 config: Mapping[str, str], replication_factor: int = -1,
                 timeout_s: float | None = None) -> bool:
    """Create ``topic`` (True), or leave the one that exists as it is (False). A
    failure raises its translated error; a missing ACL is a DeniedError naming
    CREATE on the topic."""
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                   config=dict(config))
    with translated(Where("create_topics", topic=topic)):
        try:
            admin.create_topics([new], request_timeout=30.0)[topic].result(timeout_s)
        except KafkaException as exc:
            error = kafka_error(exc)
            if error is not None and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise
    return True


def produce_lines(config: Config, topic: str, lines: Iterable[bytes]) -> int:
    """Each line a record of ``topic`` (no key), written idempotently; how many."""
    producer = Producer({**config, "enable.idempotence": True,
                         "logger": librdkafka_logger("topics")})
    count = 0
    with translated(Where("produce", topic=topic)):
        for line in lines:
            produce(producer, Produced(topic, None, line, []))  # waits while the queue is full
            count += 1
        left = producer.flush(60)
    if left:
        raise TimeoutError(f"{left} records to {topic} not delivered in 60 s")
    return count


def follow(config: Config, topic: str, *, idle_s: float) -> Iterator[bytes | None]:
    """The committed records of ``topic`` from its start (read_committed, every
    partition), values in the order they come, until none came for ``idle_s``."""
    consumer = Consumer({**config, "logger": librdkafka_logger("topics"),
                         "group.id": f"txstage-topics-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    where = Where("consume", topic=topic)
    try:
        with translated(where):
            described = consumer.list_topics(topic, timeout=30).topics.get(topic)
            if described is None or described.error is not None:
                raise LookupError(f"topic {topic!r} does not exist")
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                             for p in described.partitions])
        heard = time.monotonic()
        while time.monotonic() - heard < idle_s:
            with translated(where):
                messages = consumer.consume(100, 0.5)
            for message in messages:
                if message.error() is None:
                    heard = time.monotonic()
                    yield message.value()
    finally:
        consumer.close()
