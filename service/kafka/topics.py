"""Creating a topic unless it exists: the backfill's progress topic, redrive's
parking topic."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from service.errors import Where
from service.kafka.errors import kafka_error, translated


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
