"""``txstage redrive`` on a real broker: dead letters of a buggy transform,
redriven after the fix, give exactly the outputs the fixed stream would have given (as
``txstage audit`` checks by lineage); a second run, and a run killed halfway then
resumed, write nothing twice; letters that fail again go back with an attempt count.

Takes ≈ 54 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.harness.kafka import KafkaService
from tests.harness.operator_tools import tool, violations
from tests.harness.reading import end_offsets, read_committed
from tests.harness.stage import (
    PARTITIONS,
    REPO_ROOT,
    StageSetup,
    build_stage,
    produce_inputs,
    wait_for,
)

pytestmark = pytest.mark.kafka

RECORDS = 700  # 0..699: 100 multiples of 7, 15 of them multiples of 49
BUGGY = {"TXSTAGE_TRANSFORM": "tests.harness.transforms:square_broken_on_sevens"}
FIXED = {**BUGGY, "TEST_TRANSFORM_FIXED": "1"}


def outputs_end(setup: StageSetup) -> dict[str, dict[int, int]]:
    return {t: end_offsets(setup.bootstrap, t, isolation="read_uncommitted")
            for t in (setup.output_topic, setup.dlq_topic)}


@pytest.fixture
def lettered(kafka: KafkaService, unique_name: Callable[[str], str],
             tmp_path: Path) -> StageSetup:
    """The buggy stream over RECORDS inputs, stopped: 100 dead letters."""
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path)
    setup.env |= BUGGY
    produce_inputs(setup.bootstrap, setup.input_topic, range(RECORDS), PARTITIONS)
    replica = setup.replica("buggy")
    setup.wait_committed()
    assert replica.terminate() == 0
    return setup


def test_redriven_letters_equal_the_fixed_stream_and_a_second_run_writes_nothing(
        lettered: StageSetup) -> None:
    setup = lettered
    code, audit, err = tool(setup, "audit", "--stuck-after", "1", env=BUGGY)
    assert code == 0 and violations(audit) == {}, (err, audit)
    code, audit, err = tool(setup, "audit", "--stuck-after", "1", env=FIXED)
    assert code == 0 and audit["letters_pending"] == 100 - 15, (err, audit)

    before = outputs_end(setup)
    code, dry, err = tool(setup, "redrive", "--dry-run", env=FIXED)
    assert code == 0, err
    assert (dry["letters"], dry["redriven"], dry["failed_again"]) == (100, 85, 15), dry
    assert outputs_end(setup) == before, "a dry run wrote something"

    code, done, err = tool(setup, "redrive", "--batch", "20", env=FIXED)
    assert code == 0, err
    assert (done["redriven"], done["outputs"], done["failed_again"]) == (85, 85, 15), done
    again = [r for r in read_committed(setup.bootstrap, setup.dlq_topic)
             if r.header("txstage.redrive.attempt") == b"1"]
    assert len(again) == 15 and {r.header("txstage.error.class") for r in again} == {
        b"ValueError"}

    code, audit, err = tool(setup, "audit", "--stuck-after", "1", env=FIXED)
    assert code == 0 and violations(audit) == {}, (err, audit)
    assert audit["letters_pending"] == 0 and audit["expected_outputs"] == RECORDS, audit

    after = outputs_end(setup)
    code, second, err = tool(setup, "redrive", env=FIXED)
    assert code == 0, err
    # The 15 letters written again (attempt 1) are new: they fail again, once more.
    assert (second["done_before"], second["redriven"], second["failed_again"]) == (
        100, 0, 15), second
    code, audit, err = tool(setup, "audit", "--stuck-after", "1", env=FIXED)
    assert code == 0 and violations(audit) == {}, (err, audit)
    assert sum(after[setup.output_topic].values()) == sum(
        outputs_end(setup)[setup.output_topic].values()), "the second run wrote outputs"


def test_a_redrive_killed_halfway_resumes_without_writing_anything_twice(
        lettered: StageSetup) -> None:
    setup = lettered
    slow = {**FIXED, "TEST_DELAY_MS": "40"}  # 100 letters, 10 per transaction: ~4 s
    first = subprocess.Popen([sys.executable, "-m", "service", "redrive", "--batch", "10"],
                             cwd=REPO_ROOT, env={**os.environ, **setup.env, **slow},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = f"{setup.group_id}.redrive.progress"
    try:  # three transactions of 10 marks and their commit markers
        wait_for(lambda: _written(setup, progress) >= 33, 60, "three transactions written")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)

    code, resumed, err = tool(setup, "redrive", env=FIXED)
    assert code == 0, err
    done_before, letters = resumed["done_before"], resumed["letters"]
    assert isinstance(done_before, int) and 30 <= done_before < 100, resumed
    # Letters the first run wrote again (attempt 1) are new letters: redriven now too.
    assert isinstance(letters, int) and letters > 100
    assert resumed["redriven"] + resumed["failed_again"] == letters - done_before, resumed
    marks = [r.key for r in read_committed(setup.bootstrap, progress)]
    assert len(marks) == len(set(marks)) == letters, "a letter was redriven twice"
    code, audit, err = tool(setup, "audit", "--stuck-after", "1", env=FIXED)
    assert code == 0 and violations(audit) == {}, (err, audit)
    assert audit["letters_pending"] == 0, audit


def _written(setup: StageSetup, topic: str) -> int:
    try:
        return sum(end_offsets(setup.bootstrap, topic, isolation="read_uncommitted").values())
    except Exception:  # not created yet
        return 0


def test_redrive_without_a_dead_letter_topic_exits_2(lettered: StageSetup) -> None:
    code, _, err = tool(lettered, "redrive", env={**FIXED, "TXSTAGE_DLQ_TOPIC": ""})
    assert code == 2 and "TXSTAGE_DLQ_TOPIC" in err


def test_letters_whose_outputs_go_to_a_missing_topic_go_back_instead_of_failing_the_run(
        lettered: StageSetup) -> None:
    """Redriven before the operator created the output topic: the stage dead-letters a
    record whose output topic does not exist (UnknownTopicError), and so does redrive
    now. It used the producer's size limit for every topic and asked nothing, so each
    batch's transaction failed at its commit, on every rerun."""
    setup = lettered
    missing = {**FIXED, "TXSTAGE_OUTPUT_TOPIC": f"{setup.output_topic}-not-created"}
    code, done, err = tool(setup, "redrive", env=missing)
    assert code == 0, err
    assert (done["redriven"], done["failed_again"]) == (0, 100), done
    again = [r for r in read_committed(setup.bootstrap, setup.dlq_topic)
             if r.header("txstage.redrive.attempt") == b"1"]
    assert sorted({r.header("txstage.error.class") for r in again}) == [
        b"UnknownTopicError", b"ValueError"]
    assert sum(1 for r in again if r.header("txstage.error.class") == b"UnknownTopicError") == 85


def test_a_letter_that_can_never_succeed_is_parked_and_stops_growing_the_dlq(
        lettered: StageSetup) -> None:
    """Issue 29: every run wrote an unfixable letter back to the DLQ with its attempt + 1,
    so a scheduled redrive grew the DLQ without bound. At --max-attempts it is parked
    instead (``<dlq>.parked``), marked done, and the next run has nothing to write."""
    setup = lettered  # the bug is not fixed: all 100 letters fail again, every time
    parking = f"{setup.dlq_topic}.parked"

    def dlq_size() -> int:
        return sum(end_offsets(setup.bootstrap, setup.dlq_topic,
                               isolation="read_uncommitted").values())

    code, first, err = tool(setup, "redrive", "--max-attempts", "2", env=BUGGY)
    assert code == 0, err
    assert (first["failed_again"], first["parked"]) == (100, 0), first
    grown = dlq_size()

    code, dry, err = tool(setup, "redrive", "--max-attempts", "2", "--dry-run", env=BUGGY)
    assert code == 0, err
    assert (dry["failed_again"], dry["parked"]) == (0, 100), dry

    code, second, err = tool(setup, "redrive", "--max-attempts", "2", env=BUGGY)
    assert code == 0, err
    assert (second["letters"], second["done_before"], second["failed_again"],
            second["parked"]) == (200, 100, 0, 100), second
    assert dlq_size() == grown, "the second redrive grew the DLQ"
    parked = read_committed(setup.bootstrap, parking)
    assert len(parked) == 100
    assert {(r.header("txstage.redrive.attempt"), r.header("txstage.redrive.parked"))
            for r in parked} == {(b"2", b"1")}

    code, third, err = tool(setup, "redrive", "--max-attempts", "2", env=BUGGY)
    assert code == 0, err
    assert (third["done_before"], third["failed_again"], third["parked"]) == (200, 0, 0)
    assert dlq_size() == grown, "the third redrive grew the DLQ"
    assert len(read_committed(setup.bootstrap, parking)) == 100
    code, audit, err = tool(setup, "audit", "--stuck-after", "1", env=BUGGY)
    assert code == 0 and violations(audit) == {}, (err, audit)
    assert audit["letters_parked"] == 100, audit  # read, and accounted for


def _topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def test_redriving_the_parking_topic_parks_in_place_and_the_audit_says_where(
        lettered: StageSetup) -> None:
    """Redriving ``<dlq>.parked`` as the docs say re-parked every letter that failed again
    into a new ``<dlq>.parked.parked`` (each round nesting another) that the audit never
    read. Parking is one place: a parked letter that fails again stays where it is."""
    setup = lettered
    parking = f"{setup.dlq_topic}.parked"
    code, first, err = tool(setup, "redrive", "--max-attempts", "1", env=BUGGY)
    assert code == 0 and first["parked"] == 100, (err, first)
    held = _written(setup, parking)

    as_dlq = {"TXSTAGE_DLQ_TOPIC": parking}
    for _ in range(2):  # the cause not fixed: nothing moves, however often
        code, again, err = tool(setup, "redrive", "--max-attempts", "1", env={**BUGGY, **as_dlq})
        assert code == 0, err
        assert (again["letters"], again["left_parked"], again["parked"],
                again["failed_again"], again["parking_topic"]) == (100, 100, 0, 0, parking), again
    assert f"{parking}.parked" not in _topics(setup.bootstrap)
    assert _written(setup, parking) == held, "redriving the parking topic grew it"

    code, audit, err = tool(setup, "audit", "--stuck-after", "1", env=BUGGY)
    assert code == 0 and violations(audit) == {}, (err, audit)
    assert (audit["letters_parked"], audit["parked_in"]) == (100, {parking: 100}), audit

    # The cause fixed but for multiples of 49: those 15 stay parked, in place.
    code, fixed, err = tool(setup, "redrive", env={**FIXED, **as_dlq})
    assert code == 0, err
    assert (fixed["redriven"], fixed["left_parked"], fixed["parked"]) == (85, 15, 0), fixed
    assert f"{parking}.parked" not in _topics(setup.bootstrap)
    code, audit, err = tool(setup, "audit", "--stuck-after", "1", env=FIXED)
    assert code == 0 and violations(audit) == {}, (err, audit)
    assert (audit["letters_parked"], audit["parked_in"]) == (15, {parking: 15}), audit
    assert audit["letters_pending"] == 0 and audit["expected_outputs"] == RECORDS, audit
