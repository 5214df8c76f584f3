"""A partition librdkafka leaves unfetched is noticed and fetched again.

librdkafka#5591 (open) ends with an assigned partition paused inside librdkafka while
the application believes it resumed: nothing is fetched, nothing is said. A
benchmark replica here once sat like that for good
(docs/journal/2026-11-24-partition-never-fetched.md). The race cannot be started on
demand, so this test makes its end state on a real broker: it
pauses one partition in the stage's own consumer behind the stage's back, from
another thread, then writes more input. The stage runs in this process, so the test
can reach its consumer. Without the fetch watch (``TXSTAGE_FETCH_STALL_S=0``, or the
code before it) that partition never moves again and the wait below times out.

Takes ≈ 67 s (2 cores; make test, 2026-11-28).
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer, TopicPartition
from prometheus_client import CollectorRegistry

from service.contract.loading import load_transform
from service.kafka.cluster import Cluster, OutputLimits
from service.kafka.config import admin_config
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.preflight import check_cluster, producer_max_bytes
from service.settings import load_settings
from service.stage.replica import Stage
from tests.harness.reading import read_topic
from tests.harness.stage import (
    PARTITIONS,
    StageSetup,
    long_transactions,
    produce_inputs,
    value,
    wait_for,
)

pytestmark = pytest.mark.kafka

WEDGED = 3


def test_a_partition_librdkafka_leaves_unfetched_is_fetched_again(stage: StageSetup) -> None:
    settings = load_settings({**stage.env, "TXSTAGE_FETCH_STALL_S": "2",
                              "TXSTAGE_COMMIT_INTERVAL_MS": "100"})
    cluster = Cluster(admin_config(settings))
    check_cluster(settings, cluster, wait_s=30)
    metrics = Metrics(CollectorRegistry())
    replica = Stage(settings, load_transform(settings.transform), metrics, Health(),
                    OutputLimits(cluster, producer_max_bytes(settings), blocking=False),
                    session_timeout_s=6.0)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            replica.run()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="stage", daemon=True)
    thread.start()
    try:
        produce_inputs(stage.bootstrap, stage.input_topic, range(400), PARTITIONS)
        wait_for(stage.committed, 60, "the first input committed", stage.diagnose)
        replica.consumer.pause([TopicPartition(stage.input_topic, WEDGED)])
        produce_inputs(stage.bootstrap, stage.input_topic, range(400, 800), PARTITIONS)
        wait_for(stage.committed, 60, f"partition {WEDGED} fetched again", stage.diagnose)
        assert metrics.fetch_stalls._value.get() >= 1
        assert not failed, failed
    finally:
        replica.stop()
        thread.join(60)
    assert not thread.is_alive() and not failed, failed
    stage.assert_exactly_once()


def test_records_queued_behind_a_slow_transform_are_not_taken_for_a_stall(
        stage: StageSetup) -> None:
    # The pair: the watch's wait (1 s) far shorter than a partition waits for its turn
    # behind the others' records (8 batches of 500 at 1 ms a record). While consume()
    # comes back full, positions standing still say nothing: no fetcher is restarted.
    produce_inputs(stage.bootstrap, stage.input_topic, range(6000), PARTITIONS)
    replica = stage.replica("a", TXSTAGE_FETCH_STALL_S="1",
                            **long_transactions(delay_ms=1, commit_interval_ms=100))
    stage.wait_committed(120)
    assert value(replica, "txstage_fetch_stalls_total") == 0, stage.logs()
    assert not replica.events("partition.fetch_stalled")
    assert replica.terminate() == 0
    stage.assert_exactly_once()


def test_a_partition_read_to_a_commit_marker_is_neither_stalled_nor_lagging(
        stage: StageSetup) -> None:
    # Transactional input (an upstream txstage, Kafka Streams): each partition ends in
    # a commit marker, an offset no read_committed reader is given. The first watch
    # took "Kafka holds offsets past the position" for unfetched records and restarted
    # the fetchers of an idle stage every quiet period; the lag gauge read 1 for good,
    # and TxstageNoCommitsWhileLagging would have paged after 15 idle minutes.
    producer = Producer({"bootstrap.servers": stage.bootstrap,
                         "transactional.id": f"upstream-{stage.group_id}"})
    producer.init_transactions(30)
    for start in range(0, 400, 100):
        producer.begin_transaction()
        for i in range(start, start + 100):
            producer.produce(stage.input_topic, str(i).encode(), f"k{i}".encode(),
                             partition=i % PARTITIONS)
        producer.commit_transaction(30)
    replica = stage.replica("a", TXSTAGE_FETCH_STALL_S="1")
    # (The group's offsets stop at the markers, one short of the end offsets: wait for
    # the outputs instead.)
    assert len(read_topic(stage.bootstrap, stage.output_topic, expected=400, timeout=60)) == 400
    time.sleep(9)  # idle: 1 s to suspect, up to 5 s to confirm, housekeeping each 1 s
    lags = [value(replica, "txstage_consumer_lag", topic=stage.input_topic, partition=str(p))
            for p in range(PARTITIONS)]
    stalls = value(replica, "txstage_fetch_stalls_total")
    assert replica.terminate() == 0
    assert stalls == 0 and not replica.events("partition.fetch_stalled"), stage.logs()
    assert lags == [0.0] * PARTITIONS
    stage.assert_exactly_once()
