"""A transform call that never returns becomes a dead letter (TXSTAGE_TRANSFORM_TIMEOUT_MS).

Two replicas, a transform that sleeps an hour at p0@30, every time it is called there,
restarted by the test when they exit as an orchestrator would. On the code before the
time-out, the first replica's other partitions stood still until it left the group,
the second took them, reached p0@30 and hung too, and nothing moved again: p0 never
passed 30 and the test times out waiting for the committed offsets.

Takes ≈ 20 s (2 cores, shared broker).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from service import Output, Record
from service.examples.square import square
from service.exit_codes import ExitCode
from service.kafka.reading import read_topics
from tests.harness.stage import (
    PARTITIONS,
    StageSetup,
    one_protocol,
    produce_inputs,
)

pytestmark = pytest.mark.kafka

HANG_AT = 30
TIMEOUT_S = 3
ATTEMPTS = 2


def square_unless_hung(record: Record) -> Iterator[Output]:
    """What the stage must write for tests.harness.transforms:hangs_at."""
    if record.partition == 0 and record.offset == HANG_AT:
        raise TimeoutError("hung")
    yield from square(record)


@one_protocol("classic")  # the watch and the overruns topic do not depend on the protocol
def test_a_transform_call_that_never_returns_is_dead_lettered(stage: StageSetup) -> None:
    env = {"TXSTAGE_TRANSFORM": "tests.harness.transforms:hangs_at",
           "TEST_HANG_AT": str(HANG_AT), "TEST_HANG_PARTITION": "0",
           "TXSTAGE_TRANSFORM_TIMEOUT_MS": str(TIMEOUT_S * 1000),
           "TXSTAGE_MAX_RECORD_ATTEMPTS": str(ATTEMPTS)}
    replicas = [stage.replica("a", **env), stage.replica("b", **env)]
    produce_inputs(stage.bootstrap, stage.input_topic, range(100 * PARTITIONS), PARTITIONS)
    exits: list[int] = []
    deadline = time.monotonic() + 75
    while not stage.committed():
        assert time.monotonic() < deadline, f"not committed; exits {exits}\n{stage.diagnose()}"
        for replica in replicas:
            code = replica.returncode()
            if code is not None:  # the orchestrator restarts it
                exits.append(code)
                replica.start()
        time.sleep(0.5)
    # One exit per overrun, each one the time-out's; the third owner dead-letters it.
    assert exits == [ExitCode.TRANSFORM_TIMED_OUT] * ATTEMPTS, (exits, stage.logs())
    timed_out = [event for replica in replicas for event in replica.events("transform.timed_out")]
    assert sorted(int(e["overruns"]) for e in timed_out) == [1, 2], timed_out  # type: ignore[call-overload]
    for event in timed_out:
        assert (event["partition"], event["offset"]) == (0, HANG_AT), event
        # Noticed at most a twentieth of the time-out late (plus the machine's jitter).
        assert TIMEOUT_S <= float(event["seconds"]) < TIMEOUT_S + 1, event  # type: ignore[arg-type]
    stage.assert_exactly_once(square_unless_hung)
    [letter] = read_topics(stage.bootstrap, [stage.dlq_topic])
    headers = dict(letter.headers)
    assert headers["txstage.error.class"] == b"TransformTimeoutError", headers
    assert (headers["txstage.error.partition"], headers["txstage.error.offset"]) == \
        (b"0", str(HANG_AT).encode())
    assert f"on {ATTEMPTS} attempts".encode() in headers["txstage.error.message"]
    assert {replica.stop() for replica in replicas} == {0}
