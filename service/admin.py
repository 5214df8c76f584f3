"""Cluster facts the stage checks before and while it runs: topics, their limits,
the broker's transaction time-out ceiling. All AdminClient use lives here."""

from __future__ import annotations

import threading

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from service.errors import RetriableError, Where, translate
from service.kafka_config import Config

_TIMEOUT_S = 15.0
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's producer default


class UnknownTopicError(LookupError):
    """A transform routed an output to a topic that does not exist."""


class Cluster:
    """A thin, cached view of the cluster through one AdminClient. The cache matters:
    the start-up checks describe the output and dead-letter topics, so the running
    stage never needs the admin API for them (during a broker failure it may hang)."""

    def __init__(self, config: Config) -> None:
        self._admin = AdminClient(config)
        self._lock = threading.Lock()
        self._topic_configs: dict[str, dict[str, str]] = {}

    def existing_topics(self) -> set[str]:
        try:
            return set(self._admin.list_topics(timeout=_TIMEOUT_S).topics)
        except KafkaException as exc:
            raise translate(exc, Where("list_topics")) from exc

    def topic_config(self, topic: str) -> dict[str, str]:
        with self._lock:
            cached = self._topic_configs.get(topic)
        if cached is not None:
            return cached
        config = self._describe(ConfigResource(ConfigResource.Type.TOPIC, topic), topic)
        with self._lock:
            self._topic_configs[topic] = config
        return config

    def broker_config(self) -> dict[str, str]:
        metadata = self._admin.list_topics(timeout=_TIMEOUT_S)
        broker_id = str(next(iter(metadata.brokers)))
        return self._describe(ConfigResource(ConfigResource.Type.BROKER, broker_id), None)

    def _describe(self, resource: ConfigResource, topic: str | None) -> dict[str, str]:
        future = self._admin.describe_configs([resource])[resource]
        where = Where("describe_configs", topic=topic)
        try:
            entries = future.result(timeout=_TIMEOUT_S)
        except TimeoutError as exc:  # the cluster's failure, never the record's
            raise RetriableError(where, KafkaError(
                KafkaError._TIMED_OUT, f"no answer within {_TIMEOUT_S} s", retriable=True)) from exc
        except KafkaException as exc:
            if topic is not None and "UNKNOWN_TOPIC" in str(exc):
                raise UnknownTopicError(f"topic {topic!r} does not exist") from exc
            raise translate(exc, where) from exc
        return {name: entry.value for name, entry in entries.items()}


class OutputLimits:
    """``topic -> max bytes`` for an output: the smaller of the producer's
    ``message.max.bytes`` and the topic's ``max.message.bytes``. Raises
    UnknownTopicError for a topic that does not exist, which dead-letters the
    record instead of looping on a produce that can never succeed."""

    def __init__(self, cluster: Cluster, producer_max_bytes: int) -> None:
        self._cluster = cluster
        self._producer_max = producer_max_bytes
        self._known: dict[str, int] = {}  # hot path: one dict lookup per output

    def __call__(self, topic: str) -> int:
        limit = self._known.get(topic)
        if limit is None:
            config = self._cluster.topic_config(topic)
            topic_max = int(config.get("max.message.bytes", self._producer_max))
            limit = self._known[topic] = min(topic_max, self._producer_max)
        return limit
