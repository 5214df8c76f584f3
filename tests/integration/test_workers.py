"""TXSTAGE_WORKERS: the transform in worker processes, exactly once and in partition
order, with the faults only workers have (a worker killed, a record that kills its
worker, a call that never returns) and those every stage has (SIGKILL and SIGTERM of
the replica, a rebalance) landing while chunks are out in the workers.

Takes ≈ 100 s (2 cores, shared broker).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service import Output, Record
from service.examples.square import square
from service.kafka.reading import read_topics
from tests.harness.admin import create_topic
from tests.harness.stage import (
    PARTITIONS,
    StageSetup,
    all_committed,
    one_protocol,
    produce_inputs,
    value,
    wait_for,
)

pytestmark = pytest.mark.kafka

WORKERS = {"TXSTAGE_WORKERS": "2"}


def worker_pids(pid: int) -> list[int]:
    """The replica's worker processes (its children named by multiprocessing)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]


@one_protocol("classic")
def test_workers_process_every_record_exactly_once(stage: StageSetup) -> None:
    replica = stage.replica("a", **WORKERS)
    produce_inputs(stage.bootstrap, stage.input_topic, range(400 * PARTITIONS), PARTITIONS)
    stage.wait_committed(60)
    stage.assert_exactly_once()
    assert value(replica, "txstage_workers_alive") == 2
    assert replica.stop() == 0


def square_unless_exits(record: Record) -> Iterator[Output]:
    """What the stage must write for tests.harness.transforms:exits_at (p0@30)."""
    if record.partition == 0 and record.offset == 30:
        raise RuntimeError("ended its worker")
    yield from square(record)


def square_unless_hung(record: Record) -> Iterator[Output]:
    """What the stage must write for tests.harness.transforms:hangs_at (p0@30)."""
    if record.partition == 0 and record.offset == 30:
        raise TimeoutError("hung")
    yield from square(record)


def only_letter(stage: StageSetup) -> dict[str, bytes]:
    [letter] = read_topics(stage.bootstrap, [stage.dlq_topic])
    return dict(letter.headers)


@one_protocol("classic")
def test_a_record_that_kills_its_worker_every_time_is_dead_lettered(stage: StageSetup) -> None:
    replica = stage.replica("a", **WORKERS, TXSTAGE_TRANSFORM="tests.harness.transforms:exits_at",
                            TXSTAGE_MAX_RECORD_ATTEMPTS="2")
    produce_inputs(stage.bootstrap, stage.input_topic, range(100 * PARTITIONS), PARTITIONS)
    stage.wait_committed(60)
    stage.assert_exactly_once(square_unless_exits)
    headers = only_letter(stage)
    assert headers["txstage.error.class"] == b"TransformCrashedError", headers
    assert (headers["txstage.error.partition"], headers["txstage.error.offset"]) == (b"0", b"30")
    assert b"exit code 70" in headers["txstage.error.message"], headers
    assert replica.alive(), "the replica never exits for a worker"
    assert value(replica, "txstage_worker_restarts_total") == 2
    assert replica.stop() == 0


@one_protocol("classic")
def test_a_call_that_never_returns_is_dead_lettered_once_it_overran_enough(
        stage: StageSetup) -> None:
    replica = stage.replica("a", **WORKERS, TXSTAGE_TRANSFORM="tests.harness.transforms:hangs_at",
                            TXSTAGE_TRANSFORM_TIMEOUT_MS="1500", TXSTAGE_MAX_RECORD_ATTEMPTS="2")
    produce_inputs(stage.bootstrap, stage.input_topic, range(100 * PARTITIONS), PARTITIONS)
    started = time.monotonic()
    stage.wait_committed(60)
    assert time.monotonic() - started < 2 * 1.5 + 10, "two time-outs and a restart each"
    stage.assert_exactly_once(square_unless_hung)
    headers = only_letter(stage)
    assert headers["txstage.error.class"] == b"TransformTimeoutError", headers
    assert b"TXSTAGE_TRANSFORM_TIMEOUT_MS=1500 on 2 attempt(s)" in \
        headers["txstage.error.message"], headers
    assert replica.alive()
    assert value(replica, "txstage_transform_timeouts_total") == 2
    assert replica.stop() == 0


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
@one_protocol("classic")
def test_a_worker_killed_mid_batch_loses_nothing(stage: StageSetup, guarantee: str) -> None:
    replica = stage.replica("a", **WORKERS, TXSTAGE_GUARANTEE=guarantee,
                            TXSTAGE_TRANSFORM="tests.harness.transforms:slow_square",
                            TEST_DELAY_MS="2")
    produce_inputs(stage.bootstrap, stage.input_topic, range(300 * PARTITIONS), PARTITIONS)
    wait_for(lambda: value(replica, "txstage_transactions_committed_total") > 3, 30,
             "a few commits")
    assert replica.proc is not None
    os.kill(worker_pids(replica.proc.pid)[0], signal.SIGKILL)
    stage.wait_committed(60)
    report = stage.verify()
    if guarantee == "exactly_once":
        assert report.ok, "\n".join(report.problems()) + stage.logs()
    else:  # nothing lost; the chunk ran again, so nothing was even written twice
        assert not (report.missing or report.behind or report.mismatched), report.problems()
    wait_for(lambda: value(replica, "txstage_worker_restarts_total") == 1, 5, "the restart count")
    assert value(replica, "txstage_workers_alive") == 2
    assert replica.stop() == 0


@one_protocol("classic")
def test_a_stop_with_chunks_in_flight_exits_0_within_the_budget(stage: StageSetup) -> None:
    env = {**WORKERS, "TXSTAGE_TRANSFORM": "tests.harness.transforms:slow_square",
           "TEST_DELAY_MS": "20", "TXSTAGE_SHUTDOWN_TIMEOUT_S": "8"}
    replica = stage.replica("a", **env)
    produce_inputs(stage.bootstrap, stage.input_topic, range(200 * PARTITIONS), PARTITIONS)
    wait_for(lambda: value(replica, "txstage_worker_chunks_in_flight") > 0, 30, "chunks out")
    started = time.monotonic()
    assert replica.stop() == 0
    assert time.monotonic() - started < 8
    stage.replica("b", **{**env, "TEST_DELAY_MS": "0"})
    stage.wait_committed(60)
    stage.assert_exactly_once()


@one_protocol("classic")
def test_a_slow_head_record_keeps_its_partition_in_order_through_a_crash(
        stage: StageSetup) -> None:
    # p0@0 takes 5 s; the records behind it finish first in the other worker, and wait.
    env = {**WORKERS, "TXSTAGE_TRANSFORM": "tests.harness.transforms:slow_head",
           "TEST_HEAD_S": "5", "TXSTAGE_BATCH_SIZE": "50"}
    first = stage.replica("a", **env)
    produce_inputs(stage.bootstrap, stage.input_topic, range(200 * PARTITIONS), PARTITIONS)
    time.sleep(3)
    first.kill()  # SIGKILL while p0's head is out and chunks behind it are done
    stage.replica("b", **{**env, "TEST_HEAD_S": "1"})
    stage.wait_committed(60)
    stage.assert_exactly_once()  # V3: every partition's outputs in input order


@pytest.mark.parametrize("stage", ["classic", "consumer"], indirect=True)
def test_a_rebalance_with_chunks_in_flight_stays_exactly_once(stage: StageSetup) -> None:
    env = {**WORKERS, "TXSTAGE_TRANSFORM": "tests.harness.transforms:slow_square",
           "TEST_DELAY_MS": "3"}
    stage.replica("a", **env)
    produce_inputs(stage.bootstrap, stage.input_topic, range(400 * PARTITIONS), PARTITIONS)
    time.sleep(2)
    stage.replica("b", **env)
    stage.wait_committed(90)
    stage.assert_exactly_once()


def outputs_of(bootstrap: str, topics: list[str], name: str) -> list[list[tuple[object, ...]]]:
    """Each topic's records as (key, value, headers), in a fixed order; the run's own
    topic names (which an error message may quote) said alike."""
    def alike(data: bytes | None) -> bytes | None:
        return data.replace(f"-{name}-".encode(), b"-run-") if data else data

    return [sorted((r.key, alike(r.value), tuple((h, alike(v)) for h, v in r.headers))
                   for r in read_topics(bootstrap, [topic]))
            for topic in topics]


@one_protocol("classic")
def test_workers_write_byte_identical_outputs_and_dead_letters(stage: StageSetup) -> None:
    """A fan-out transform with failures mid-output, outputs too large for their topic,
    outputs of the wrong type, and a near-limit input: the same bytes either way."""
    produce_inputs(stage.bootstrap, stage.input_topic, range(1, 60 * PARTITIONS), PARTITIONS)
    # A near-limit input the transform cannot read (too many digits): its dead letter is
    # cut to fit the dead-letter topic alike in both runs.
    produce_inputs(stage.bootstrap, stage.input_topic, [9000], PARTITIONS,
                   value=lambda i: b"7" * 1_048_300, max_bytes=1_048_588)
    written = []
    for workers in ("0", "2"):
        name = f"w{workers}"
        out, side, dlq = (create_topic(stage.bootstrap, f"{stage.output_topic}-{name}-{role}",
                                       partitions=4) for role in ("out", "side", "dlq"))
        replica = stage.replica(
            name, TXSTAGE_WORKERS=workers, TXSTAGE_GROUP_ID=f"{stage.group_id}-{name}",
            TXSTAGE_TRANSACTIONAL_ID_PREFIX=f"{stage.group_id}-{name}",
            TXSTAGE_OUTPUT_TOPIC=out, TXSTAGE_DLQ_TOPIC=dlq, TEST_SIDE_TOPIC=side,
            TEST_BIG_BYTES="1048100",
            TXSTAGE_TRANSFORM="tests.harness.transforms:fanout_with_faults")
        wait_for(lambda group=f"{stage.group_id}-{name}": _committed(stage, group), 60,
                 f"{name} committed")
        assert replica.stop() == 0
        written.append(outputs_of(stage.bootstrap, [out, side, dlq], name))
    in_process, with_workers = written
    assert [len(topic) for topic in in_process] == [len(topic) for topic in with_workers]
    assert all(in_process), [len(topic) for topic in in_process]
    for topic_in, topic_workers in zip(in_process, with_workers, strict=True):
        differ = [(a, b) for a, b in zip(topic_in, topic_workers, strict=True) if a != b]
        assert not differ, differ[:2]


def _committed(stage: StageSetup, group: str) -> bool:
    return all_committed(stage.bootstrap, group, [stage.input_topic])
