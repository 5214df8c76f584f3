"""The stage against a real broker: every scenario ends with the lineage check
(V1-V5, service/verify.py) over everything read back read_committed."""

from __future__ import annotations

import signal
import threading

import pytest

from tests.harness.reading import read_uncommitted
from tests.integration.conftest import PARTITIONS, StageSetup
from tests.integration.replicas import all_committed, produce_inputs, wait_for

pytestmark = pytest.mark.kafka


def assert_exactly_once(stage: StageSetup, **kwargs: object) -> None:
    report = stage.verify(**kwargs)  # type: ignore[arg-type]
    assert report.ok, "\n".join(report.problems()) + "\n" + stage.logs()
    assert report.found == report.expected > 0


def wait_all_committed(stage: StageSetup, timeout: float = 90) -> None:
    wait_for(lambda: all_committed(stage.bootstrap, stage.group_id, [stage.input_topic]),
             timeout, "the group's committed offsets to reach the input end", stage.logs)


def test_two_replicas_process_every_record_exactly_once(stage: StageSetup) -> None:
    first, second = stage.replica("a"), stage.replica("b")
    produce_inputs(stage.bootstrap, stage.input_topic, range(20_000), PARTITIONS)
    wait_all_committed(stage)
    assert_exactly_once(stage)
    assert {first.terminate(), second.terminate()} == {0}
    assigned = first.events("partitions.assigned") + second.events("partitions.assigned")
    owned = {p for event in assigned for p in event["partitions"]}  # type: ignore[attr-defined]
    assert len(owned) == PARTITIONS


def test_scale_out_and_in_moves_producers_without_duplicates(stage: StageSetup) -> None:
    first = stage.replica("first")
    wait_for(first.ready, 30, "the first replica to be ready", stage.logs)
    feeder = threading.Thread(target=produce_inputs, args=(
        stage.bootstrap, stage.input_topic, range(30_000), PARTITIONS),
        kwargs={"value": lambda i: str(i).encode()})
    feeder.start()
    second = stage.replica("second", TXSTAGE_TRANSFORM="tests.integration.transforms:slow_square",
                           TEST_DELAY_MS="0")
    wait_for(lambda: bool(second.events("partitions.assigned")) and second.ready(), 60,
             "the second replica to take partitions", stage.logs)
    assert first.terminate() == 0  # scale in while input is still arriving
    feeder.join()
    wait_all_committed(stage)
    assert_exactly_once(stage)
    moved = {p for e in second.events("partitions.assigned") for p in e["partitions"]}  # type: ignore[attr-defined]
    assert len(moved) == PARTITIONS, "the survivor must own every partition in the end"
    assert first.events("partitions.revoked"), "the leaving replica must revoke and close"
    assert second.terminate() == 0


def test_sigkill_mid_transaction_leaves_nothing_visible(stage: StageSetup) -> None:
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    slow = {"TXSTAGE_TRANSFORM": "tests.integration.transforms:slow_square",
            "TEST_DELAY_MS": "2", "TXSTAGE_COMMIT_INTERVAL_MS": "3000",
            "TXSTAGE_COMMIT_MAX_RECORDS": "100000"}
    victim = stage.replica("victim", **slow)
    # Kill only once outputs of an open transaction are on the broker.
    wait_for(lambda: len(read_uncommitted(stage.bootstrap, stage.output_topic)) > 50, 60,
             "uncommitted outputs from the victim", stage.logs)
    victim.kill()
    aborted_attempt = len(read_uncommitted(stage.bootstrap, stage.output_topic))
    successor = stage.replica("successor")
    wait_all_committed(stage)
    assert_exactly_once(stage)
    assert aborted_attempt > 0
    assert successor.terminate() == 0


def test_zombie_is_fenced_after_rebalance(stage: StageSetup) -> None:
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    slow = {"TXSTAGE_TRANSFORM": "tests.integration.transforms:slow_square",
            "TEST_DELAY_MS": "1", "TXSTAGE_COMMIT_INTERVAL_MS": "2000",
            "TXSTAGE_COMMIT_MAX_RECORDS": "100000"}
    zombie = stage.replica("zombie", **slow)
    wait_for(lambda: len(read_uncommitted(stage.bootstrap, stage.output_topic)) > 50, 60,
             "the zombie to have open transactions", stage.logs)
    zombie.signal(signal.SIGSTOP)  # paused past its session time-out (6 s)
    heir = stage.replica("heir")
    wait_all_committed(stage)
    zombie.signal(signal.SIGCONT)
    wait_for(lambda: bool(zombie.events("producer.fenced") or zombie.events("partitions.lost")),
             60, "the zombie to notice it lost its partitions", stage.logs)
    assert_exactly_once(stage)
    assert zombie.events("producer.fenced"), "the zombie's producers must have been fenced"
    assert heir.terminate() == 0


def test_injected_abortable_errors_still_exactly_once(stage: StageSetup,
                                                      new_topic: object) -> None:
    compacted = new_topic(1, {"cleanup.policy": "compact"}, prefix="compact")  # type: ignore[operator]
    replica = stage.replica("a", TXSTAGE_TRANSFORM=(
        "tests.integration.transforms:square_with_broker_rejects"),
        TEST_COMPACTED_TOPIC=compacted)
    produce_inputs(stage.bootstrap, stage.input_topic, range(3_000), PARTITIONS)
    wait_all_committed(stage)
    assert_exactly_once(stage)
    aborts = [e for e in replica.events("transaction.aborted")
              if e.get("reason") == "abortable_error"]
    assert aborts, "the broker's rejections must have aborted transactions"
    assert 'txstage_transactions_aborted_total{reason="abortable_error"}' in replica.metrics()
    assert replica.terminate() == 0


def test_poison_records_go_to_the_dead_letter_topic_exactly_once(stage: StageSetup) -> None:
    bad = {7, 1_234, 2_999}
    produce_inputs(stage.bootstrap, stage.input_topic, range(3_000), PARTITIONS,
                   value=lambda i: b"not-a-number" if i in bad else str(i).encode())
    replica = stage.replica("a")
    wait_all_committed(stage)
    assert_exactly_once(stage)  # the expectation includes the dead letters
    letters = [e for e in replica.events("record.dead_lettered")]
    assert len(letters) == len(bad)
    assert replica.terminate() == 0
