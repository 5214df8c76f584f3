"""A backfill writes a record over librdkafka's default message.max.bytes exactly as the
stream does: its producers and per-output checks are sized from its sink topics'
max.message.bytes (preflight.sized_max_bytes), as the stage's are from its own.

A 1,000,469-byte input (the topic default, 1,048,588, takes it) that the transform
passes through is written whole to the sink's output topic; one it rejects is
dead-lettered whole. Before, the backfill kept librdkafka's 1,000,000: the passed one
was dead-lettered (OutputTooLargeError) and both letters left their value out
(txstage.error.dropped), where the stream wrote them whole: `backfill verify` said
DIFFERENT.

Takes ≈ 25 s (2 cores; this module alone, on the shared broker).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.contract.deadletter import DROPPED
from service.kafka.reading import read_topics
from tests.harness.spark import (  # noqa: F401  (fixtures)
    Backfill,
    backfill_fixture,
    spark_fixture,
)
from tests.harness.stage import PARTITIONS, StageSetup, one_protocol, produce_inputs
from tests.harness.transforms import REJECTED
from tests.integration.test_backfill_kafka import compare_with_stream, run_stream

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.usefixtures("spark")]

SIZE = 1_000_469  # over librdkafka's default message.max.bytes, within the topic's limit
TOPIC_DEFAULT = 1_048_588  # the broker's max.message.bytes: what the input takes
TRANSFORM = "tests.harness.transforms:identity_rejecting_marked"
REJECTED_AT, PASSED_AT = 9, 18  # partition 1 and 2, offset 1 and 2
INPUTS = 40


def _value(i: int) -> bytes:
    if i == REJECTED_AT:
        return REJECTED + b"r" * (SIZE - len(REJECTED))
    return b"p" * SIZE if i == PASSED_AT else str(i).encode()


@one_protocol("classic")
def test_a_record_over_a_megabyte_is_backfilled_whole_or_dead_lettered_whole_as_streamed(
        stage: StageSetup, new_topic: Callable[..., str], backfill: Backfill) -> None:
    produce_inputs(stage.bootstrap, stage.input_topic, range(INPUTS), PARTITIONS, value=_value,
                   max_bytes=TOPIC_DEFAULT)
    run_stream(stage, TRANSFORM)
    out, dlq = new_topic(partitions=4, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")

    code, printed, err = backfill("--source", f"kafka://{stage.input_topic}",
                                  "--sink", f"kafka://{out}", "--dlq-topic", dlq,
                                  "--transform", TRANSFORM)
    assert code == 0, err
    letters = read_topics(stage.bootstrap, [dlq])
    assert len(letters) == 1, [dict(r.headers).get(DROPPED) for r in letters]
    headers = dict(letters[0].headers)
    assert headers.get(DROPPED) is None, headers[DROPPED]
    assert letters[0].value == _value(REJECTED_AT), len(letters[0].value or b"")
    passed = [r.value for r in read_topics(stage.bootstrap, [out]) if len(r.value or b"") == SIZE]
    assert passed == [_value(PASSED_AT)], "the passed record: written whole, not dead-lettered"
    assert "dead-lettered   1" in printed, printed

    report = compare_with_stream(stage, out, dlq)
    assert report.ok, report.problems()
    assert report.expected == report.actual == INPUTS
    code, printed, _ = backfill(
        "verify", "--expected", f"kafka://{stage.output_topic},{stage.dlq_topic}",
        "--actual", f"kafka://{out},{dlq}", "--topic-map", f"{stage.output_topic}={out}",
        "--topic-map", f"{stage.dlq_topic}={dlq}", "--job-id", backfill.job_id(printed))
    assert code == 0 and "EQUAL" in printed, printed
