"""TXSTAGE_TRANSACTIONS=spanning against a real broker: one transaction for all of a
replica's partitions, fenced by the group (KIP-447). The exactly-once suite's cases,
in this mode; each ends with the lineage check (V1-V5) over what is read back
read_committed. Rebalances and fencing run under both group protocols.

Takes ≈ 95 s (2 cores; 2026-11-29)."""

from __future__ import annotations

import signal
import time

import pytest

from tests.harness.reading import read_committed, read_uncommitted
from tests.harness.stage import (
    PARTITIONS,
    StageSetup,
    long_transactions,
    one_protocol,
    produce_inputs,
    wait_for,
)
from tests.integration.test_stage_exactly_once import (
    test_poison_records_go_to_the_dead_letter_topic_exactly_once as poison_records,
)
from tests.integration.test_stage_exactly_once import (
    test_scale_out_and_in_moves_producers_without_duplicates as scale_out_and_in,
)

pytestmark = pytest.mark.kafka
SPANNING = {"TXSTAGE_TRANSACTIONS": "spanning"}


@pytest.fixture
def spanning(stage: StageSetup) -> StageSetup:
    stage.env.update(SPANNING)
    return stage


@one_protocol("classic")  # both protocols: the scale and zombie cases
def test_two_replicas_share_one_transaction_each_exactly_once(spanning: StageSetup) -> None:
    stage = spanning
    first, second = stage.replica("a"), stage.replica("b")
    produce_inputs(stage.bootstrap, stage.input_topic, range(20_000), PARTITIONS)
    stage.wait_committed()
    stage.assert_exactly_once()
    assert {first.terminate(), second.terminate()} == {0}
    ids = {e["transactional_id"] for r in (first, second) for e in r.events("producer.ready")}
    assert len(ids) == 2 and all(".replica." in i for i in ids), ids  # type: ignore[operator]


def test_scale_out_and_in_commits_every_partition_before_it_moves(
        spanning: StageSetup) -> None:
    scale_out_and_in(spanning)  # the exactly-once suite's case, in this mode


@one_protocol("classic")  # the group protocol plays no part
def test_sigkill_mid_transaction_leaves_nothing_visible(spanning: StageSetup) -> None:
    stage = spanning
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    # A random transactional id: the victim's open transaction holds back what readers
    # see of the outputs until the coordinator aborts it, at its time-out (10 s here).
    victim = stage.replica("victim", TXSTAGE_TRANSACTION_TIMEOUT_MS="10000",
                           **long_transactions(delay_ms=2, commit_interval_ms=1000))
    wait_for(lambda: len(read_uncommitted(stage.bootstrap, stage.output_topic)) > 50, 60,
             "uncommitted outputs from the victim", stage.logs)
    victim.kill()
    successor = stage.replica("successor")
    stage.wait_committed(timeout=120)
    wait_for(lambda: len(read_committed(stage.bootstrap, stage.output_topic)) >= 4_000, 60,
             "the victim's transaction to time out", stage.logs)
    stage.assert_exactly_once()
    assert successor.terminate() == 0


@one_protocol("classic")  # KIP-848 refuses the instance id until its session ends
def test_a_restart_with_the_same_instance_id_fences_the_dead_transaction_at_once(
        spanning: StageSetup) -> None:
    stage = spanning
    static = {"TXSTAGE_CONSUMER__GROUP_INSTANCE_ID": "replica-0"}
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    victim = stage.replica("victim", **static,
                           **long_transactions(delay_ms=2, commit_interval_ms=3000))
    wait_for(lambda: len(read_uncommitted(stage.bootstrap, stage.output_topic)) > 50, 60,
             "uncommitted outputs from the victim", stage.logs)
    victim.kill()
    started = time.monotonic()
    successor = stage.replica("successor", **static)
    # Its init_transactions aborts the victim's transaction: long before its 60 s time-out.
    wait_for(lambda: len(read_committed(stage.bootstrap, stage.output_topic)) >= 4_000, 40,
             "every output visible", stage.logs)
    assert time.monotonic() - started < 40
    stage.wait_committed()
    stage.assert_exactly_once()
    assert successor.terminate() == 0


def test_a_paused_replica_cannot_commit_after_its_partitions_moved(
        spanning: StageSetup) -> None:
    stage = spanning
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    zombie = stage.replica("zombie", TXSTAGE_TRANSACTION_TIMEOUT_MS="30000",
                           **long_transactions(delay_ms=1, commit_interval_ms=2000))
    wait_for(lambda: len(read_uncommitted(stage.bootstrap, stage.output_topic)) > 50, 60,
             "the zombie to have an open transaction", stage.logs)
    zombie.signal(signal.SIGSTOP)  # paused past its session time-out (6 s)
    heir = stage.replica("heir")
    stage.wait_committed(timeout=120)
    zombie.signal(signal.SIGCONT)
    wait_for(lambda: bool(zombie.events("partitions.lost") or zombie.events("transaction.aborted")
                          or zombie.returncode() is not None),
             60, "the zombie to notice it lost its partitions", stage.logs)
    stage.assert_exactly_once()  # its open transaction's outputs never became visible
    assert heir.terminate() == 0


@one_protocol("classic")  # the group protocol plays no part
def test_poison_records_go_to_the_dead_letter_topic_exactly_once(spanning: StageSetup) -> None:
    poison_records(spanning)  # the exactly-once suite's case, in this mode


@one_protocol("classic")  # the group protocol plays no part
def test_a_refused_output_aborts_every_partition_and_all_are_redone(
        spanning: StageSetup, new_topic: object) -> None:
    stage = spanning
    compacted = new_topic(1, {"cleanup.policy": "compact"}, prefix="compact")  # type: ignore[operator]
    replica = stage.replica("a", TXSTAGE_TRANSFORM=(
        "tests.harness.transforms:square_with_broker_rejects"),
        TEST_COMPACTED_TOPIC=compacted)
    produce_inputs(stage.bootstrap, stage.input_topic, range(3_000), PARTITIONS)
    stage.wait_committed()
    stage.assert_exactly_once()
    reasons = [e.get("reason") for e in replica.events("transaction.aborted")]
    assert "abortable_error" in reasons, reasons
    assert replica.terminate() == 0


@one_protocol("classic")  # the group protocol plays no part
def test_sigterm_mid_transaction_commits_every_partition_and_exits_0(
        spanning: StageSetup) -> None:
    stage = spanning
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    replica = stage.replica("a", **long_transactions(delay_ms=2, commit_interval_ms=5000))
    wait_for(lambda: len(read_uncommitted(stage.bootstrap, stage.output_topic)) > 200, 60,
             "an open transaction", stage.logs)
    before = len(read_uncommitted(stage.bootstrap, stage.output_topic))
    started = time.monotonic()
    assert replica.terminate() == 0
    assert time.monotonic() - started < 25
    committed_by_stop = len(read_committed(stage.bootstrap, stage.output_topic))
    assert committed_by_stop >= before, (committed_by_stop, before)
    stage.replica("b")
    stage.wait_committed()
    stage.assert_exactly_once()


@one_protocol("classic")
def test_the_transform_in_worker_processes_shares_the_transaction_too(
        spanning: StageSetup) -> None:
    stage = spanning
    replica = stage.replica("a", TXSTAGE_WORKERS="2")
    produce_inputs(stage.bootstrap, stage.input_topic, range(10_000), PARTITIONS)
    stage.wait_committed()
    stage.assert_exactly_once()
    assert replica.terminate() == 0
