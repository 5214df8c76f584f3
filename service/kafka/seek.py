"""A consumer's seek, which librdkafka may refuse for a while, and the re-assignment
that replaces a seek it refuses for good."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from service.errors import Where
from service.kafka.errors import kafka_error, translate, translated

# The partition is not fetched yet (just assigned) or a seek is still in progress.
_NOT_YET = frozenset({KafkaError._STATE, KafkaError._PREV_IN_PROGRESS})


def seek(consumer: Consumer, tp: TopicPartition, where: Where) -> bool:
    """Seek ``tp``; False when librdkafka is not fetching the partition yet (the
    caller tries again later). Any other failure raises its translated error."""
    try:
        consumer.seek(tp)
    except KafkaException as exc:
        error = kafka_error(exc)
        if error is None or error.code() not in _NOT_YET:
            raise translate(exc, where) from exc
        return False
    return True


def reassign(consumer: Consumer, tps: list[TopicPartition], where: Where) -> None:
    """Unassign ``tps`` and assign them again, each at its ``offset`` (incremental: the
    rest of the assignment is untouched). librdkafka starts their fetchers there,
    without asking the group coordinator for committed offsets."""
    with translated(where):
        consumer.incremental_unassign([TopicPartition(tp.topic, tp.partition) for tp in tps])
        consumer.incremental_assign(tps)
