"""Faults beyond one replica: oversized outputs, and a partition leader killed in a
3-node cluster (RF 3, min.insync.replicas 2) while the stage runs."""

from __future__ import annotations

import threading

import pytest

from service.deadletter import ERROR_CLASS
from tests.harness.admin import partition_leaders
from tests.harness.reading import read_committed
from tests.integration.conftest import PARTITIONS, StageSetup
from tests.integration.replicas import produce_inputs, wait_for
from tests.integration.transforms import square_unless_big, square_unless_refused

pytestmark = pytest.mark.kafka


def test_oversized_outputs_are_dead_lettered_not_looped_on(stage: StageSetup,
                                                          new_topic: object) -> None:
    small = new_topic(4, {"max.message.bytes": "20000"}, prefix="small")  # type: ignore[operator]
    stage.output_topic = small
    replica = stage.replica("a", TXSTAGE_OUTPUT_TOPIC=small,
                            TXSTAGE_TRANSFORM="tests.integration.transforms:big_every_tenth",
                            TXSTAGE_PRODUCER__MESSAGE_MAX_BYTES="20000")
    produce_inputs(stage.bootstrap, stage.input_topic, range(800), PARTITIONS)
    stage.wait_committed()
    report = stage.verify(square_unless_big)
    assert report.ok, report.problems()
    letters = read_committed(stage.bootstrap, stage.dlq_topic)
    assert len(letters) == 80
    assert {letter.header(ERROR_CLASS) for letter in letters} == {b"OutputTooLargeError"}
    assert not replica.events("transaction.aborted")
    assert replica.terminate() == 0


def test_leader_kill_in_a_three_node_cluster(cluster3: object, stage_on: object) -> None:
    stage: StageSetup = stage_on(cluster3)  # type: ignore[operator]
    first, second = stage.replica("a"), stage.replica("b")
    feeder = threading.Thread(target=produce_inputs, args=(
        stage.bootstrap, stage.input_topic, range(20_000), PARTITIONS))
    feeder.start()
    wait_for(lambda: first.ready() and second.ready(), 60, "replicas ready", stage.logs)
    leader = partition_leaders(stage.bootstrap, stage.input_topic)[0]
    cluster3.kill(leader)  # type: ignore[attr-defined]
    feeder.join()
    stage.wait_committed(180)
    cluster3.restart(leader)  # type: ignore[attr-defined]
    stage.assert_exactly_once()
    assert {first.terminate(), second.terminate()} == {0}


def test_a_record_whose_output_the_broker_always_refuses_is_found_and_dead_lettered(
        stage: StageSetup, new_topic: object) -> None:
    compacted = new_topic(1, {"cleanup.policy": "compact"}, prefix="compact")  # type: ignore[operator]
    replica = stage.replica("a", TEST_COMPACTED_TOPIC=compacted, TXSTAGE_TRANSFORM=(
        "tests.integration.transforms:square_with_refused_outputs"))
    produce_inputs(stage.bootstrap, stage.input_topic, range(1_600), PARTITIONS)
    stage.wait_committed(120)
    report = stage.verify(square_unless_refused)
    assert report.ok, report.problems()
    letters = read_committed(stage.bootstrap, stage.dlq_topic)
    assert sorted(int(letter.header("txstage.error.offset") or b"-1") for letter in letters) \
        == sorted([42, 142] * PARTITIONS)
    assert {letter.header(ERROR_CLASS) for letter in letters} == {b"OutputRefusedError"}
    assert replica.events("partition.isolating") and replica.events("record.output_refused")
    assert replica.terminate() == 0
