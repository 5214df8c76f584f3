"""Time, not the consumed batch, bounds a transaction, a stop and the heartbeat; and
no record's bytes can make the stage exit. Real replicas, real broker, transforms
that take real time (20-40 ms a record).

Each test failed on the code before the fix: the slow transform livelocked (every
transaction timed out by the coordinator, the same 500 records redone for ever,
/healthz 200), the stop ran past its budget, and the near-limit record's dead letter
was refused by produce() and the replica exited 1, as did each next owner; an
output topic deleted at run time made the stage abort the same transactions for ever.

About 85 s.

Takes ≈ 45 s (2 cores; make test, 2026-11-28).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from service.contract import lineage
from service.contract.deadletter import DROPPED
from service.kafka.reading import read_topics
from tests.harness.admin import create_topic
from tests.harness.kafka import KafkaService
from tests.harness.stage import (
    PARTITIONS,
    StageSetup,
    build_stage,
    produce_inputs,
    tear_down,
    value,
    wait_for,
)

pytestmark = pytest.mark.kafka


@pytest.fixture
def classic_stage(kafka: KafkaService, unique_name: Callable[[str], str],
                  tmp_path: Path) -> Iterator[StageSetup]:
    """One group protocol: what is tested here is the loop's, not the group's."""
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path, "classic")
    yield setup
    tear_down(setup)


def test_a_slow_transform_commits_within_the_transaction_timeout(
        classic_stage: StageSetup) -> None:
    # 20 ms a record, 600 records on one partition, a 4 s transaction time-out: one
    # 500-record batch is 10 s of transform. The coordinator aborted each transaction
    # first (epoch bump), the partition came back a session later from the committed
    # offset and did the same records again, for ever, with /healthz at 200 (seen with
    # both group protocols; the bound is the loop's, so one protocol is tested).
    stage = classic_stage
    replica = stage.replica("a", TXSTAGE_TRANSFORM="tests.harness.transforms:slow_square",
                            TEST_DELAY_MS="20", TXSTAGE_TRANSACTION_TIMEOUT_MS="4000",
                            TXSTAGE_HEALTH_STALE_AFTER_S="3")
    wait_for(replica.ready, 60, "replica ready", stage.logs)
    unhealthy: list[str] = []
    done = threading.Event()

    def watch_liveness() -> None:  # a batch longer than stale_after failed the probe
        while not done.wait(0.5):
            status, body = replica.get("/healthz")
            if status != 200:
                unhealthy.append(body)

    watcher = threading.Thread(target=watch_liveness, daemon=True)
    watcher.start()
    produce_inputs(stage.bootstrap, stage.input_topic, range(600), 1)
    try:
        stage.wait_committed(60)
    finally:
        done.set()
        watcher.join()
    stage.assert_exactly_once()
    assert not replica.events("producer.fenced"), "a transaction outlived its time-out"
    assert value(replica, "txstage_transactions_aborted_total", reason="timed_out") == 0
    assert not unhealthy, unhealthy[:3]
    assert replica.terminate() == 0


def test_a_stop_in_the_middle_of_a_slow_batch_commits_what_was_processed_in_time(
        classic_stage: StageSetup) -> None:
    # 40 ms a record and an 8 s shutdown budget: the loop finished its 500-record batch
    # (20 s) first, the watchdog fired at 8 s and nothing processed was committed.
    stage = classic_stage
    produce_inputs(stage.bootstrap, stage.input_topic, range(600), 1)  # a full first batch
    replica = stage.replica("a", TXSTAGE_TRANSFORM="tests.harness.transforms:slow_square",
                            TEST_DELAY_MS="40", TXSTAGE_SHUTDOWN_TIMEOUT_S="8",
                            TXSTAGE_COMMIT_INTERVAL_MS="1000")
    wait_for(replica.ready, 60, "replica ready", stage.logs)
    time.sleep(3)  # 3 s into a 20 s batch, a transaction open
    stopped = time.monotonic()
    assert replica.terminate(timeout=30) == 0
    took = time.monotonic() - stopped
    assert took < 4, f"the stop took {took:.1f} s"
    assert not replica.events("stage.shutdown_budget_exceeded"), stage.logs()
    # The rest is left to the next owner: all of it, once, in order.
    successor = stage.replica("b", TXSTAGE_TRANSFORM="tests.harness.transforms:slow_square",
                              TEST_DELAY_MS="2")
    stage.wait_committed(60)
    stage.assert_exactly_once()
    assert successor.terminate() == 0


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_a_near_limit_poison_record_is_dead_lettered_cut_to_fit(
        classic_stage: StageSetup, guarantee: str) -> None:
    # A 1,048,400-byte value (the input topic takes it) that square rejects: its letter
    # (value + error headers) is over the dead-letter topic's max.message.bytes
    # (1,048,588). produce() refused such a letter, fatal: exit 1, and the next owner
    # the same.
    stage = classic_stage
    replica = stage.replica("a", TXSTAGE_GUARANTEE=guarantee)
    big = b"x" * 1_048_400
    produce_inputs(stage.bootstrap, stage.input_topic, range(400), 2,
                   value=lambda i: big if i == 101 else str(i).encode(), max_bytes=1_048_588)
    stage.wait_committed(60)
    assert replica.alive(), stage.logs()
    stage.assert_exactly_once()
    [letter] = read_topics(stage.bootstrap, [stage.dlq_topic])
    headers = dict(letter.headers)
    assert headers[DROPPED] == b"value=1048400" and letter.value is None
    assert headers["txstage.error.offset"] == b"50"  # input 101: partition 1, offset 50
    assert replica.terminate() == 0


def test_an_output_topic_deleted_at_run_time_dead_letters_its_records(
        classic_stage: StageSetup, unique_name: Callable[[str], str]) -> None:
    # The topic's limits stayed cached, its outputs failed delivery, and the stage
    # aborted the same transactions again and again (_INCONSISTENT): nothing was
    # committed in 150 s. The refusal now names its record, the limits are looked up
    # again, and the records routed to the missing topic are dead-lettered. When the
    # deletion reaches the producer only after its outputs were queued, they wait out
    # message.timeout.ms (capped at the transaction time-out), the transaction aborts
    # and the replay is dead-lettered: the short time-out bounds that path.
    stage = classic_stage
    side = create_topic(stage.bootstrap, unique_name("side"), partitions=2)
    replica = stage.replica(
        "a", TXSTAGE_TRANSFORM="tests.harness.transforms:square_and_copy_to_side",
        TEST_SIDE_TOPIC=side, TXSTAGE_TRANSACTION_TIMEOUT_MS="10000")
    produce_inputs(stage.bootstrap, stage.input_topic, range(200), PARTITIONS)
    stage.wait_committed(60)
    admin = AdminClient({"bootstrap.servers": stage.bootstrap})
    for future in admin.delete_topics([side]).values():
        future.result(30)
    produce_inputs(stage.bootstrap, stage.input_topic, range(200, 400), PARTITIONS)
    stage.wait_committed(90)
    assert replica.alive(), stage.logs()
    found = [lineage.read(r.headers) for r in read_topics(stage.bootstrap,
                                                           [stage.output_topic, stage.dlq_topic])]
    sources = [(tag.partition, tag.offset) for tag in found if tag is not None]
    assert len(sources) == len(set(sources)) == 400, "each input: its square or its letter"
    letters = {e["error_class"] for e in replica.events("record.dead_lettered")}
    assert letters and letters <= {"UnknownTopicError", "OutputRefusedError"}, letters
    assert replica.terminate() == 0
