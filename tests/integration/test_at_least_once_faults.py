"""At-least-once mode under faults: a refused delivery on some partitions
only, and replicas scaling while offsets are committed. Duplicates are allowed in
this mode; loss, foreign outputs, lag and replicas dying are not.

Takes ≈ 140 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from service.contract.deadletter import ERROR_CLASS, ERROR_OFFSET, ERROR_PARTITION
from service.tools.verify import Report
from tests.harness.reading import read_committed
from tests.harness.stage import PARTITIONS, StageSetup, produce_inputs, wait_for
from tests.harness.transforms import square_unless_refused_on_some_partitions
from tests.integration.test_compound_faults import (
    SteadyFeed,
    assert_alive,
    compacted_topic,
    settle,
    spread_over,
)

pytestmark = pytest.mark.kafka

AT_LEAST_ONCE = {"TXSTAGE_GUARANTEE": "at_least_once"}


def assert_nothing_lost(report: Report) -> None:
    assert not (report.missing or report.unexpected or report.mismatched or report.behind), \
        report.problems()
    assert report.expected > 0


def test_at_least_once_refused_delivery_is_dead_lettered_on_its_own_partition(
        stage: StageSetup, new_topic: Callable[..., str]) -> None:
    # Offsets 42 and 142 of input partitions 1 and 5 write only a keyless record to a
    # compacted topic, refused on every attempt; the transform takes 3 ms a record. The
    # old stage had one delivery latch for all partitions: the failure was blamed on
    # whichever partitions were due (rewound, again and again, never dead-lettered) while
    # a partition that was not due committed past its failed record (lost).
    compacted = compacted_topic(new_topic)
    replica = stage.replica(
        "a", **AT_LEAST_ONCE, TEST_DELAY_MS="3", TEST_COMPACTED_TOPIC=compacted,
        TXSTAGE_TRANSFORM="tests.harness.transforms:refused_on_some_partitions")
    produce_inputs(stage.bootstrap, stage.input_topic, range(1_600), PARTITIONS)
    settle(stage, [replica], 60)
    assert_nothing_lost(stage.verify(square_unless_refused_on_some_partitions))
    letters = read_committed(stage.bootstrap, stage.dlq_topic)
    assert {(int(letter.header(ERROR_PARTITION) or b"-1"),
             int(letter.header(ERROR_OFFSET) or b"-1")) for letter in letters} \
        == {(p, o) for p in (1, 5) for o in (42, 142)}
    assert {letter.header(ERROR_CLASS) for letter in letters} == {b"OutputRefusedError"}
    assert replica.terminate() == 0


def test_at_least_once_refusals_are_dead_lettered_while_the_group_rebalances(
        stage: StageSetup, new_topic: Callable[..., str]) -> None:
    # Two faults at once: refused outputs (offsets 42, 142, 242 of partitions 1 and 5;
    # 3 ms a record) and a second replica joining, then leaving, while they are found.
    # A flowing partition writes its outputs unnamed, so its first refusal names no
    # record; the records up to it are then written again, named (name_until). That
    # state is the owner's: a partition that moves mid-way starts unnamed again on its
    # new owner, which must still find and dead-letter the record, losing nothing.
    compacted = compacted_topic(new_topic)
    settings = {**AT_LEAST_ONCE, "TEST_DELAY_MS": "3", "TEST_COMPACTED_TOPIC": compacted,
                "TXSTAGE_TRANSFORM": "tests.harness.transforms:refused_on_some_partitions"}
    replicas = [stage.replica("a", **settings)]
    wait_for(replicas[0].ready, 30, "the first replica to be ready", stage.logs)
    with SteadyFeed(stage.bootstrap, stage.input_topic, 2_400, 8) as feed:
        time.sleep(1)
        replicas.append(stage.replica("b", **settings))
        wait_for(lambda: spread_over(stage, replicas), 45, "two replicas, each with partitions",
                 stage.logs)
        time.sleep(1)
        assert replicas[1].terminate() == 0, stage.logs()
        assert_alive(stage, replicas[:1])
        feed.wait()
    settle(stage, replicas[:1], 90)
    assert_nothing_lost(stage.verify(square_unless_refused_on_some_partitions))
    letters = read_committed(stage.bootstrap, stage.dlq_topic)
    assert {(int(letter.header(ERROR_PARTITION) or b"-1"),
             int(letter.header(ERROR_OFFSET) or b"-1")) for letter in letters} \
        == {(p, o) for p in (1, 5) for o in (42, 142, 242)}
    assert {letter.header(ERROR_CLASS) for letter in letters} == {b"OutputRefusedError"}
    assert replicas[0].terminate() == 0


def test_at_least_once_replicas_survive_scaling_from_1_to_6_to_3(stage: StageSetup) -> None:
    # While the group rebalances, the old stage's synchronous offset commit raised
    # ILLEGAL_GENERATION / REBALANCE_IN_PROGRESS, classified fatal: replicas exited 1.
    # Those mean "not committed": rewind to the committed offset and go on.
    settings = {**AT_LEAST_ONCE, "TXSTAGE_TRANSFORM": "tests.harness.transforms:slow_square",
                "TEST_DELAY_MS": "1"}
    replicas = [stage.replica("r0", **settings)]
    wait_for(replicas[0].ready, 30, "the first replica to be ready", stage.logs)
    with SteadyFeed(stage.bootstrap, stage.input_topic, 6_000, 25) as feed:
        time.sleep(2)
        replicas += [stage.replica(f"r{i}", **settings) for i in range(1, 6)]
        wait_for(lambda: spread_over(stage, replicas), 45, "six replicas, each with partitions",
                 stage.logs)
        time.sleep(2)
        for leaving in replicas[3:]:  # scale in while the feed still runs
            assert leaving.terminate() == 0, stage.logs()
            assert_alive(stage, replicas[:3])
        feed.wait()
    settle(stage, replicas[:3], 60)
    assert_nothing_lost(stage.verify())
    assert [r.terminate() for r in replicas[:3]] == [0, 0, 0]


def test_at_least_once_stall_past_max_poll_interval_resumes_from_kafka(stage: StageSetup) -> None:
    # The transform stalls 6 s on partition 0 with thousands of records already fetched
    # behind it; max.poll.interval.ms = 3 s makes librdkafka leave the group, and the
    # same consume() call that reports the partitions lost assigns them back. The
    # partition must resume from the offset committed in Kafka: seen in a chaos
    # campaign, it resumed from librdkafka's old fetch position instead and committed
    # past 1 474 records that were never transformed.
    replica = stage.replica("a", **AT_LEAST_ONCE,
                            TXSTAGE_TRANSFORM="tests.harness.transforms:stall_once",
                            TEST_STALL_AT="300", TEST_STALL_S="6",
                            TXSTAGE_CONSUMER__MAX_POLL_INTERVAL_MS="3000",
                            **stage.session_timeout_env(2000))
    produce_inputs(stage.bootstrap, stage.input_topic, range(40_000), PARTITIONS)
    settle(stage, [replica], 90)
    assert_nothing_lost(stage.verify())
    assert replica.events("partitions.lost"), "the stall must have cost the assignment"
    assert replica.terminate() == 0
