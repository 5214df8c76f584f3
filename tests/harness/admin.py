"""Topic and cluster administration for tests: create a topic and wait until it is usable,
look at leaders and ISRs. Plain functions over a bootstrap string."""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata
from confluent_kafka.cimpl import NewTopic

from service.local_kafka.readiness import listed_brokers

__all__ = [
    "broker_ids",
    "create_topic",
    "in_sync_replicas",
    "partition_leaders",
    "wait_for_isr",
]


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _metadata(bootstrap: str, topic: str, timeout: float) -> ClusterMetadata:
    return _admin(bootstrap).list_topics(topic, timeout=timeout)


def create_topic(
    bootstrap: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int | None = None,
    config: Mapping[str, str | int] | None = None,
    timeout: float = 30.0,
) -> str:
    """Create ``name`` and wait until every partition has a leader in the metadata.

    ``replication_factor=None`` uses the broker's ``default.replication.factor`` (1 on the
    single-node broker, 3 on a 3-node harness cluster).
    """
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config={key: str(value) for key, value in (config or {}).items()},
    )
    admin = _admin(bootstrap)  # must outlive the future: a destroyed handle fails it
    admin.create_topics([topic], request_timeout=timeout)[name].result(timeout + 5)
    deadline = time.monotonic() + timeout
    while True:
        leaders = partition_leaders(bootstrap, name, timeout=max(1.0, deadline - time.monotonic()))
        if len(leaders) == partitions and all(leader >= 0 for leader in leaders.values()):
            return name
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name!r} has no leader for every partition: {leaders}")
        time.sleep(0.1)


def partition_leaders(bootstrap: str, topic: str, *, timeout: float = 10.0) -> dict[int, int]:
    """partition -> leader node id (-1 while there is none); empty if the topic is unknown."""
    described = _metadata(bootstrap, topic, timeout).topics.get(topic)
    if described is None or described.error is not None:
        return {}
    return {p: meta.leader for p, meta in sorted(described.partitions.items())}


def group_coordinator(bootstrap: str, group: str) -> int:
    """The group's coordinator: the leader of its __consumer_offsets partition
    (Java's String.hashCode of the group id, modulo the partition count)."""
    leaders = partition_leaders(bootstrap, "__consumer_offsets")
    code = 0
    for char in group:
        code = (31 * code + ord(char)) & 0xFFFFFFFF
    code = code - (1 << 32) if code >= 1 << 31 else code
    return leaders[abs(code) % len(leaders)]


def in_sync_replicas(bootstrap: str, topic: str, *, timeout: float = 10.0) -> dict[int, list[int]]:
    """partition -> ISR node ids, as the metadata reports them."""
    described = _metadata(bootstrap, topic, timeout).topics.get(topic)
    if described is None or described.error is not None:
        error = described.error if described is not None else None
        raise KafkaException(
            error or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no topic {topic!r}")
        )
    return {p: sorted(meta.isrs) for p, meta in sorted(described.partitions.items())}


def wait_for_isr(bootstrap: str, topic: str, size: int, *, timeout: float = 30.0) -> float:
    """Until every partition of ``topic`` has ``size`` in-sync replicas; returns the wait
    in seconds, raises :class:`TimeoutError` with the last ISRs seen."""
    began = time.monotonic()
    while True:
        isrs = in_sync_replicas(bootstrap, topic)
        if all(len(isr) >= size for isr in isrs.values()):
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"ISRs of {topic!r} after {timeout:.0f} s: {isrs}, want {size}")
        time.sleep(0.2)


def broker_ids(bootstrap: str, *, timeout: float = 10.0) -> list[int]:
    """Ids of the brokers the cluster currently reports as alive."""
    return sorted(listed_brokers(bootstrap, timeout))
