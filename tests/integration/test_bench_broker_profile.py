"""``bench.throughput --broker-profile``: Java Flight Recorder on the real broker JVM
finds the transactional produce requests a client sent while it recorded.

Takes ≈ 2 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from bench.broker_profile import BrokerProfile, summarise
from bench.common import listening_pids
from tests.harness.kafka import KafkaService

RECORDS = 60_000
VALUE = b"v" * 1000


def test_the_broker_profile_sees_a_clients_transactional_produce_requests(
        kafka: KafkaService, new_topic: Callable[..., str], group_id: str,
        tmp_path: Path) -> None:
    pids = listening_pids(kafka.bootstrap)
    assert len(pids) == 1, f"the suite's broker is a JVM on this box: {pids}"
    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5,
                         "transactional.id": f"{group_id}-profiled"})
    producer.init_transactions(30)
    profile = BrokerProfile(pids[0], tmp_path)
    profile.start("produce")
    for _ in range(3):
        producer.begin_transaction()
        for i in range(RECORDS // 3):
            while True:
                try:
                    producer.produce(topic, VALUE, b"%d" % i)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(30)
    recording = profile.stop()
    assert recording is not None and recording.stat().st_size > 0
    counts = summarise(profile.samples(recording))
    produce = counts["Produce"] + counts["Produce (verified)"]
    assert produce > 0, f"no sample served a produce request: {counts.most_common(10)}"
    assert profile.stop() is None  # nothing is recording any more
