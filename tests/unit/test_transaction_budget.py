"""TXSTAGE_MAX_TRANSACTIONS_PER_S: the replica's transactions a second stay within the
budget by stretching the commit interval at many busy partitions, and nothing changes
at a few (stage/budget.py)."""

from __future__ import annotations

import time
from dataclasses import replace

from service.stage import machine as sm
from service.stage.budget import budgeted_interval
from service.stage.partition import Partition
from tests.unit.fakes import ScriptedConsumer, make_loop


def test_a_few_partitions_keep_the_configured_interval() -> None:
    assert budgeted_interval(0.1, 8, 100.0, 6.0) == 0.1   # 80 a second: within 100


def test_many_busy_partitions_stretch_the_interval_to_the_budget() -> None:
    assert budgeted_interval(0.1, 64, 100.0, 6.0) == 0.64  # 100 a second, not 640


def test_the_stretch_stops_at_a_tenth_of_the_transaction_time_out() -> None:
    assert budgeted_interval(0.1, 10_000, 100.0, 6.0) == 6.0


def test_no_budget_or_no_busy_partition_changes_nothing() -> None:
    assert budgeted_interval(0.1, 64, 0.0, 6.0) == 0.1
    assert budgeted_interval(0.1, 0, 100.0, 6.0) == 0.1


def test_the_loop_applies_the_budget_to_its_busy_partitions_only() -> None:
    loop, _, first = make_loop(ScriptedConsumer(), TXSTAGE_MAX_TRANSACTIONS_PER_S="40")
    now = time.monotonic()
    for number in range(1, 64):
        partition = Partition(first.topic, number)
        partition.state = sm.PartitionState(sm.Phase.ACTIVE)
        if number <= 19:  # 20 busy with partition 0 below; 44 idle
            partition.state = sm.PartitionState(sm.Phase.ACTIVE, txn=sm.Txn(0, 1, 1, now))
        loop.partitions[partition.key] = partition
    first.committed_at = now
    loop.policy = replace(loop.policy, commit_interval_s=0.1, transaction_timeout_s=60.0)
    loop.housekeeper.due_at = 0.0
    loop._housekeeping(now)
    assert loop.policy.interval_s == 20 / 40
    assert loop.metrics.commit_interval._value.get() == 0.5  # type: ignore[attr-defined]
    for partition in loop.partitions.values():
        partition.state, partition.committed_at = sm.PartitionState(sm.Phase.ACTIVE), -1e9
    loop.housekeeper.due_at = 0.0
    loop._housekeeping(now + 5)
    assert loop.policy.interval_s == 0.1, "idle again: back to the configured one"
