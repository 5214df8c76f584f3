"""A record the input topic took is never lost for the producers' size: the stage's
producers are sized from the output and dead-letter topics' max.message.bytes (the
topic default, 1,048,588), not librdkafka's message.max.bytes default (1,000,000).

A 1,000,469-byte input (the topic takes it) the transform rejects is dead-lettered
whole and redriven whole once the transform is fixed; one it passes through is
produced. Before the sizing the passed one was refused as too large for the producer
and dead-lettered, and both letters left their value out (txstage.error.dropped),
which redrive cannot process.

Takes ≈ 12 s (2 cores; this module alone, 2026-11-28).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.contract import lineage
from service.contract.deadletter import DROPPED
from service.kafka.reading import read_topics
from tests.harness.kafka import KafkaService
from tests.harness.operator_tools import tool
from tests.harness.stage import StageSetup, build_stage, produce_inputs, tear_down
from tests.harness.transforms import REJECTED, identity_rejecting_marked

pytestmark = pytest.mark.kafka

SIZE = 1_000_469  # over librdkafka's default message.max.bytes, within the topic's limit
TOPIC_DEFAULT = 1_048_588  # the broker's max.message.bytes: what the input takes
TRANSFORM = {"TXSTAGE_TRANSFORM": "tests.harness.transforms:identity_rejecting_marked"}
REJECTED_AT, PASSED_AT = 101, 202  # input 101: partition 1, offset 50; 202: partition 0


@pytest.fixture
def classic_stage(kafka: KafkaService, unique_name: Callable[[str], str],
                  tmp_path: Path) -> Iterator[StageSetup]:
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path, "classic")
    setup.env |= TRANSFORM
    yield setup
    tear_down(setup)


def _value(i: int) -> bytes:
    if i == REJECTED_AT:
        return REJECTED + b"r" * (SIZE - len(REJECTED))
    return b"p" * SIZE if i == PASSED_AT else str(i).encode()


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_a_record_over_a_megabyte_is_produced_or_dead_lettered_whole_and_redriven_whole(
        classic_stage: StageSetup, guarantee: str) -> None:
    stage = classic_stage
    replica = stage.replica("a", TXSTAGE_GUARANTEE=guarantee)
    produce_inputs(stage.bootstrap, stage.input_topic, range(300), 2, value=_value,
                   max_bytes=TOPIC_DEFAULT)
    stage.wait_committed(60)
    assert replica.terminate() == 0, stage.logs()

    letters = {dict(r.headers)["txstage.error.offset"]: r
               for r in read_topics(stage.bootstrap, [stage.dlq_topic])}
    headers = dict(letters[b"50"].headers)  # input 101: partition 1, offset 50
    assert headers.get(DROPPED) is None, headers[DROPPED]
    assert letters[b"50"].value == _value(REJECTED_AT), len(letters[b"50"].value or b"")
    passed = [r for r in read_topics(stage.bootstrap, [stage.output_topic])
              if len(r.value or b"") == SIZE]
    assert [r.value for r in passed] == [_value(PASSED_AT)], (
        "the passed record: produced whole, not dead-lettered",
        {offset: dict(r.headers).get(DROPPED) for offset, r in letters.items()})
    assert len(letters) == 1
    stage.assert_exactly_once(identity_rejecting_marked)

    code, report, err = tool(stage, "redrive", env={"TEST_TRANSFORM_FIXED": "1"})
    assert code == 0, err
    assert (report["redriven"], report["outputs"], report["failed_again"]) == (1, 1, 0), report
    [redriven] = [r for r in read_topics(stage.bootstrap, [stage.output_topic])
                  if dict(r.headers).get(lineage.REDRIVEN)]
    assert redriven.value == _value(REJECTED_AT), len(redriven.value or b"")
