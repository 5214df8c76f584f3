"""The stage against a real broker: every scenario ends with the lineage check
(V1-V5, service/tools/verify.py) over everything read back read_committed.

Takes ≈ 115 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import signal
import threading

import pytest

from tests.harness.reading import read_committed, read_uncommitted
from tests.harness.stage import (
    PARTITIONS,
    StageSetup,
    long_transactions,
    paced,
    produce_inputs,
    wait_for,
)
from tests.harness.stage import value as metric_value

pytestmark = pytest.mark.kafka


def test_two_replicas_process_every_record_exactly_once(stage: StageSetup) -> None:
    first, second = stage.replica("a"), stage.replica("b")
    produce_inputs(stage.bootstrap, stage.input_topic, range(20_000), PARTITIONS)
    stage.wait_committed()
    stage.assert_exactly_once()
    assert {first.terminate(), second.terminate()} == {0}
    assigned = first.events("partitions.assigned") + second.events("partitions.assigned")
    owned = {p for event in assigned for p in event["partitions"]}  # type: ignore[attr-defined]
    assert len(owned) == PARTITIONS


def test_scale_out_and_in_moves_producers_without_duplicates(stage: StageSetup) -> None:
    first = stage.replica("first")
    wait_for(first.ready, 30, "the first replica to be ready", stage.logs)
    feeder = threading.Thread(target=produce_inputs, args=(
        stage.bootstrap, stage.input_topic, paced(range(30_000), per_second=3_000), PARTITIONS),
        kwargs={"value": lambda i: str(i).encode()})
    feeder.start()
    second = stage.replica("second", TXSTAGE_TRANSFORM="tests.harness.transforms:slow_square",
                           TEST_DELAY_MS="0")

    def owned_by_second() -> set[str]:
        return {p for e in second.events("partitions.assigned")
                for p in e["partitions"]}  # type: ignore[attr-defined]

    # Scale out: an empty first assignment (cooperative) is not taking partitions.
    wait_for(lambda: bool(owned_by_second()) and second.ready(), 60,
             "the second replica to take partitions", stage.logs)
    assert feeder.is_alive(), "scale-out must happen while input is still arriving"
    assert first.terminate() == 0  # scale in while input is still arriving
    # The survivor takes the rest at its next rebalance, seconds after the LeaveGroup.
    wait_for(lambda: len(owned_by_second()) == PARTITIONS, 60,
             "the survivor to own every partition", stage.logs)
    feeder.join()
    stage.wait_committed()
    stage.assert_exactly_once()
    assert first.events("partitions.released"), "the leaving replica must release and close"
    assert second.terminate() == 0


def test_sigkill_mid_transaction_leaves_nothing_visible(stage: StageSetup) -> None:
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    victim = stage.replica("victim", **long_transactions(delay_ms=2, commit_interval_ms=3000))
    # Kill only once outputs of an open transaction are on the broker.
    wait_for(lambda: len(read_uncommitted(stage.bootstrap, stage.output_topic)) > 50, 60,
             "uncommitted outputs from the victim", stage.logs)
    victim.kill()
    aborted_attempt = len(read_uncommitted(stage.bootstrap, stage.output_topic))
    successor = stage.replica("successor")
    stage.wait_committed()
    stage.assert_exactly_once()
    assert aborted_attempt > 0
    assert successor.terminate() == 0


def test_zombie_is_fenced_after_rebalance(stage: StageSetup) -> None:
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    zombie = stage.replica("zombie", **long_transactions(delay_ms=1, commit_interval_ms=2000))
    wait_for(lambda: len(read_uncommitted(stage.bootstrap, stage.output_topic)) > 50, 60,
             "the zombie to have open transactions", stage.logs)
    zombie.signal(signal.SIGSTOP)  # paused past its session time-out (6 s)
    heir = stage.replica("heir")
    stage.wait_committed()
    zombie.signal(signal.SIGCONT)
    wait_for(lambda: bool(zombie.events("producer.fenced") or zombie.events("partitions.lost")),
             60, "the zombie to notice it lost its partitions", stage.logs)
    stage.assert_exactly_once()
    assert zombie.events("producer.fenced"), "the zombie's producers must have been fenced"
    assert heir.terminate() == 0


def test_injected_abortable_errors_still_exactly_once(stage: StageSetup,
                                                      new_topic: object) -> None:
    compacted = new_topic(1, {"cleanup.policy": "compact"}, prefix="compact")  # type: ignore[operator]
    replica = stage.replica("a", TXSTAGE_TRANSFORM=(
        "tests.harness.transforms:square_with_broker_rejects"),
        TEST_COMPACTED_TOPIC=compacted)
    produce_inputs(stage.bootstrap, stage.input_topic, range(3_000), PARTITIONS)
    stage.wait_committed()
    stage.assert_exactly_once()
    aborts = [e for e in replica.events("transaction.aborted")
              if e.get("reason") == "abortable_error"]
    assert aborts, "the broker's rejections must have aborted transactions"
    assert 'txstage_transactions_aborted_total{reason="abortable_error"}' in replica.metrics()
    # Every abort replaced its partition's producer (a new epoch fences any request of
    # the aborted transaction still on its way): one init per partition, one per abort.
    inits = metric_value(replica, "txstage_producer_init_seconds_count")
    assert inits >= PARTITIONS + len(aborts), (inits, len(aborts))
    assert replica.terminate() == 0


def test_a_record_held_for_a_topic_lookup_is_not_transformed_again(
        stage: StageSetup, new_topic: object) -> None:
    # The first output to a topic the stage has not looked up yet holds its record
    # until the lookup (beside the loop) answers. The record is then written from
    # what the transform yielded the first time: a transform that takes real time,
    # or one that is not quite pure, must not run twice for it. (It did, once per
    # partition: the flake in test_injected_abort_moves_the_abortable_error_reason.)
    side = new_topic(PARTITIONS, prefix="side")  # type: ignore[operator]
    replica = stage.replica("a", TXSTAGE_TRANSFORM=(
        "tests.harness.transforms:square_and_count_runs"), TEST_SIDE_TOPIC=side)
    produce_inputs(stage.bootstrap, stage.input_topic, range(2_000), PARTITIONS)
    stage.wait_committed()
    stage.assert_exactly_once()
    runs = [record.value for record in read_committed(stage.bootstrap, side, expected=2_000)]
    assert len(runs) == 2_000
    assert {value: runs.count(value) for value in set(runs)} == {b"1": 2_000}
    assert replica.terminate() == 0


def test_poison_records_go_to_the_dead_letter_topic_exactly_once(stage: StageSetup) -> None:
    bad = {7, 1_234, 2_999}
    produce_inputs(stage.bootstrap, stage.input_topic, range(3_000), PARTITIONS,
                   value=lambda i: b"not-a-number" if i in bad else str(i).encode())
    replica = stage.replica("a")
    stage.wait_committed()
    stage.assert_exactly_once()  # the expectation includes the dead letters
    letters = [e for e in replica.events("record.dead_lettered")]
    assert len(letters) == len(bad)
    assert replica.terminate() == 0


def test_at_least_once_mode_loses_nothing(stage: StageSetup) -> None:
    replica = stage.replica("a", TXSTAGE_GUARANTEE="at_least_once")
    produce_inputs(stage.bootstrap, stage.input_topic, range(3_000), PARTITIONS,
                   value=lambda i: b"bad" if i % 1000 == 5 else str(i).encode())
    stage.wait_committed()
    report = stage.verify()
    # Duplicates are allowed in this mode; loss, foreign outputs and lag are not.
    assert not (report.missing or report.unexpected or report.mismatched or report.behind), \
        report.problems()
    assert report.expected == 3_000
    assert 'txstage_build_info{group_id' in replica.metrics() and \
        'guarantee="at_least_once"' in replica.metrics()
    assert not replica.events("producer.ready"), "no transactional producers in this mode"
    assert replica.terminate() == 0
