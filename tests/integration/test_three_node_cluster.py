"""A 3-node KRaft cluster (RF 3, min.insync.replicas 2) keeps taking transactional writes
while one node is SIGKILLed, and the node rejoins the ISR after the harness restarts it.

Takes ≈ 30 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException, Producer

from tests.harness.admin import (
    broker_ids,
    create_topic,
    in_sync_replicas,
    partition_leaders,
    wait_for_isr,
)
from tests.harness.kafka import KafkaCluster
from tests.harness.reading import read_committed

pytestmark = pytest.mark.kafka

UniqueName = Callable[[str], str]


def write_in_transaction(producer: Producer, topic: str, values: list[bytes]) -> None:
    producer.begin_transaction()
    for partition, value in enumerate(values):
        producer.produce(topic, value=value, partition=partition % 3)
    producer.commit_transaction()


def wait_for_new_leader(bootstrap: str, topic: str, gone: int, timeout: float = 30.0) -> float:
    """Seconds until no partition of ``topic`` is led by (or waiting for) node ``gone``."""
    began = time.monotonic()
    while True:
        leaders = partition_leaders(bootstrap, topic)
        if leaders and all(leader not in (gone, -1) for leader in leaders.values()):
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"leaders of {topic!r} still {leaders} after killing {gone}")
        time.sleep(0.1)


def test_transactions_survive_sigkill_of_a_node_which_then_rejoins(
    cluster3: KafkaCluster, unique_name: UniqueName
) -> None:
    bootstrap = cluster3.bootstrap
    assert broker_ids(bootstrap) == [0, 1, 2]
    topic = create_topic(
        bootstrap,
        unique_name("rf3"),
        partitions=3,
        replication_factor=3,
        config={"min.insync.replicas": 2},
    )
    wait_for_isr(bootstrap, topic, 3)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": unique_name("txid"),
            "acks": "all",
            "transaction.timeout.ms": 60_000,
        }
    )
    try:
        producer.init_transactions(30)
        write_in_transaction(producer, topic, [b"before-0", b"before-1", b"before-2"])

        victim = partition_leaders(bootstrap, topic)[0]
        cluster3.kill(victim)
        assert not cluster3.is_running(victim)
        failover = wait_for_new_leader(bootstrap, topic, victim)
        assert failover < 15, failover
        # 2 of 3 replicas are still min.insync.replicas: acks=all writes must go through.
        assert all(len(isr) == 2 for isr in in_sync_replicas(bootstrap, topic).values())
        write_in_transaction(producer, topic, [b"during-0", b"during-1", b"during-2"])

        began = time.monotonic()
        cluster3.restart(victim)
        wait_for_isr(bootstrap, topic, 3, timeout=30)
        rejoined = time.monotonic() - began
        assert sorted(broker_ids(bootstrap)) == [0, 1, 2]
        write_in_transaction(producer, topic, [b"after-0", b"after-1", b"after-2"])
    finally:
        with contextlib.suppress(KafkaException):
            producer.close()

    records = read_committed(bootstrap, topic, expected=9)
    assert sorted(record.value or b"" for record in records) == sorted(
        f"{phase}-{i}".encode() for phase in ("before", "during", "after") for i in range(3)
    )
    print(f"failover {failover:.1f} s; restart until ISR is 3 again {rejoined:.1f} s")


def test_paused_node_is_fenced_and_rejoins_when_resumed(
    cluster3: KafkaCluster, unique_name: UniqueName
) -> None:
    bootstrap = cluster3.bootstrap
    topic = create_topic(bootstrap, unique_name("rf3"), partitions=3, replication_factor=3)
    wait_for_isr(bootstrap, topic, 3)
    victim = partition_leaders(bootstrap, topic)[1]

    cluster3.pause(victim)
    try:
        # Its heartbeats stop: the controller fences it after broker.session.timeout.ms.
        wait_for_new_leader(bootstrap, topic, victim)
        assert all(victim not in isr for isr in in_sync_replicas(bootstrap, topic).values())
        assert cluster3.is_running(victim)
    finally:
        cluster3.heal()  # resumes it, and waits until it serves again
    wait_for_isr(bootstrap, topic, 3, timeout=30)

    cluster3.stop(victim)  # SIGTERM: a controlled shutdown
    assert not cluster3.is_running(victim)
    wait_for_new_leader(bootstrap, topic, victim)
    # The next test's cluster3 fixture restarts it (heal()).
