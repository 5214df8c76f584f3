"""Kafka → Kafka backfills on real Spark (local[2,4]) and a real broker.

Every check is by lineage (service.backfill.parity): the backfill's outputs against the
real stage's outputs for the same input (renamed topics aside), or against what the
transform makes of the input read back read_committed.

Takes ≈ 170 s (2 cores; make test, 2026-11-28, plus ≈ 20 s for the missing-topic tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from service import Record
from service.backfill import config, kafka_clients, parity, progress, tasks
from service.backfill.plan import Slice
from service.backfill.specs import parse_sink, parse_source
from service.contract.deadletter import ERROR_CLASS
from service.errors import FencedError
from service.examples.square import square
from service.kafka.reading import read_topics
from service.local_kafka.cluster import KafkaCluster
from service.settings import environment
from service.tools.verify import expected_outputs
from tests.harness.admin import create_topic, partition_leaders
from tests.harness.backfill_faults import CRASH_AT, DIES_AT, REFUSING_TOPIC, SLOW_DIES_AT
from tests.harness.operator_tools import tool
from tests.harness.reading import end_offsets, read_committed, read_uncommitted
from tests.harness.spark import (  # noqa: F401  (fixtures)
    REPO_ROOT,
    Backfill,
    backfill_fixture,
    spark_fixture,
)
from tests.harness.stage import (
    PARTITIONS,
    StageSetup,
    all_committed,
    one_protocol,
    produce_inputs,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.usefixtures("spark")]

NewTopic = Callable[..., str]


def run_stream(stage: StageSetup, transform: str = "service.examples.square:square") -> None:
    """The real stage over the whole input, then stopped."""
    replica = stage.replica("stream", TXSTAGE_TRANSFORM=transform)
    wait_for(lambda: all_committed(stage.bootstrap, stage.group_id, [stage.input_topic]), 120,
             "the stream to commit the whole input", stage.logs)
    assert replica.terminate() == 0


def sides(stage: StageSetup, out: str, dlq: str) -> dict[str, str]:
    return {stage.output_topic: out, stage.dlq_topic: dlq}


def compare_with_stream(stage: StageSetup, out: str, dlq: str) -> parity.ParityReport:
    stream = parity.from_topics(stage.bootstrap, [stage.output_topic, stage.dlq_topic])
    return parity.compare(stream, parity.from_topics(stage.bootstrap, [out, dlq]),
                          rename=sides(stage, out, dlq))


def ends(bootstrap: str, *topics: str) -> dict[str, dict[int, int]]:
    return {t: end_offsets(bootstrap, t, isolation="read_uncommitted") for t in topics}


def test_backfill_equals_the_stream_record_for_record_and_reruns_write_nothing(
        stage: StageSetup, new_topic: NewTopic, backfill: Backfill) -> None:
    poison = lambda i: b"not a number" if i % 97 == 0 else str(i).encode()  # noqa: E731
    produce_inputs(stage.bootstrap, stage.input_topic, range(3000), PARTITIONS, value=poison)
    run_stream(stage)
    out, dlq = new_topic(partitions=4, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")
    argv = ("--source", f"kafka://{stage.input_topic}", "--sink", f"kafka://{out}",
            "--dlq-topic", dlq, "--transaction-records", "200")

    code, printed, err = backfill(*argv)
    assert code == 0, err
    report = compare_with_stream(stage, out, dlq)
    assert report.ok, report.problems()
    assert report.expected == report.actual == 3000
    assert "dead-lettered   31" in printed

    before = ends(stage.bootstrap, out, dlq)
    code, printed, err = backfill(*argv)
    assert code == 0, err
    assert "was already complete: nothing written" in printed
    assert ends(stage.bootstrap, out, dlq) == before

    job = backfill.job_id(printed)
    code, _, err = backfill("--source", f"kafka://{stage.input_topic}?from=offsets:0=5",
                            "--sink", f"kafka://{out}", "--dlq-topic", dlq, "--job-id", job)
    assert code == 2 and f"job {job} was started with source=" in err

    renames = ("--rename", f"{stage.output_topic}={out}", "--rename", f"{stage.dlq_topic}={dlq}")
    verify = ("verify", "--expected", f"kafka://{stage.output_topic},{stage.dlq_topic}",
              "--actual", f"kafka://{out},{dlq}")
    code, printed, _ = backfill(*verify, *renames, "--job-id", job)
    assert code == 0 and "3000 expected outputs, 3000 actual" in printed
    code, printed, _ = backfill(*verify, *renames[:2])  # the DLQ topic names differ
    assert code == 1 and "DIFFERENT" in printed
    code, printed, _ = backfill(*verify, *renames,
                                "--within", f"kafka://{stage.input_topic}?to=offsets:0=10")
    assert code == 0 and "10 expected outputs, 10 actual" in printed


@pytest.mark.parametrize("backfill_transform", [
    "keyless_to_compacted_at_42",
    "keyless_at_42_dying_at_150",  # and the task's first attempt dies between the refusals
])
@one_protocol("classic")
def test_a_record_whose_output_the_broker_refuses_is_dead_lettered_as_the_stream_does(
        backfill_transform: str, stage: StageSetup, new_topic: NewTopic,
        backfill: Backfill) -> None:
    # Issue 12, defect 1: the old backfill replayed the slice's transaction 3 times,
    # failed the task, Spark retried it the same way and the job failed, where the
    # stream dead-letters the one record whose output the broker refuses.
    if not partition_leaders(stage.bootstrap, REFUSING_TOPIC):  # a constant: Spark's workers
        create_topic(stage.bootstrap, REFUSING_TOPIC, config={"cleanup.policy": "compact"})
    produce_inputs(stage.bootstrap, stage.input_topic, range(1600), PARTITIONS)
    transform = "tests.harness.backfill_faults:keyless_to_compacted_at_42"
    run_stream(stage, transform)
    out, dlq = new_topic(partitions=4, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")
    code, printed, err = backfill(
        "--source", f"kafka://{stage.input_topic}", "--sink", f"kafka://{out}",
        "--dlq-topic", dlq, "--transaction-records", "100",
        "--transform", f"tests.harness.backfill_faults:{backfill_transform}",
        "--topic-map", f"{REFUSING_TOPIC}={REFUSING_TOPIC}")  # refused anyway: named
    assert code == 0, err
    report = compare_with_stream(stage, out, dlq)
    assert report.ok, report.problems()
    assert report.expected == report.actual == 1600
    letters = read_committed(stage.bootstrap, dlq)
    assert sorted(int(letter.header("txstage.error.offset") or b"-1") for letter in letters) \
        == sorted([42, 142] * PARTITIONS)
    assert {letter.header(ERROR_CLASS) for letter in letters} == {b"OutputRefusedError"}
    assert "dead-lettered   16" in printed
    if backfill_transform == "keyless_at_42_dying_at_150":  # the deaths really happened:
        # each dead attempt left offsets 100..DIES_AT of its slice in the log, aborted
        written = len(read_uncommitted(stage.bootstrap, out))
        assert written >= 1600 - 16 + PARTITIONS * (DIES_AT - 100), written


def assert_squares_of_inputs(bootstrap: str, source: str, out: str, count: int) -> None:
    """``out`` holds the square of every record of ``source``, once each, by lineage."""
    expected = expected_outputs(read_topics(bootstrap, [source]), square,
                                default_topic=out, dlq_topic=None)
    actual = list(parity.from_topics(bootstrap, [out]))
    wanted = [parity.Output(p.topic, p.key, p.value, tuple(p.headers)) for p in expected.values()]
    report = parity.compare(wanted, actual)
    assert report.ok, report.problems()
    assert report.actual == count


def test_a_task_dying_mid_slice_is_retried_with_no_duplicate_and_nothing_lost(
        new_topic: NewTopic, backfill: Backfill) -> None:
    source, out = new_topic(partitions=2, prefix="in"), new_topic(partitions=2, prefix="out")
    produce_inputs(backfill.bootstrap, source, range(1000), 2)  # offsets 0..499 per partition

    code, printed, err = backfill(
        "--source", f"kafka://{source}", "--sink", f"kafka://{out}", "--dlq-topic", "",
        "--transform", "tests.harness.backfill_faults:crash_on_first_attempt",
        "--transaction-records", "100")
    assert code == 0, err

    assert_squares_of_inputs(backfill.bootstrap, source, out, 1000)
    # The dead attempts' open transactions (offsets 200..CRASH_AT of each slice) did reach
    # the log, and stay invisible: aborted by the retry's init_transactions.
    written = len(read_uncommitted(backfill.bootstrap, out))
    assert written >= 1000 + 2 * (CRASH_AT - 200), written
    assert "inputs          1000 (" in printed


def test_a_broker_restart_during_a_slow_slice_then_a_task_death_lose_and_duplicate_nothing(
        make_cluster: Callable[..., KafkaCluster], backfill: Backfill,
        monkeypatch: pytest.MonkeyPatch, unique_name: Callable[[str], str]) -> None:
    # Two faults in one slice: the only broker is killed while a 5 ms transform is
    # mid-slice (transactions and progress writes wait for it) and comes back; then the
    # task's first attempt dies mid-transaction, and its retry must resume from the
    # progress committed across the restart.
    cluster = make_cluster(1)
    monkeypatch.setenv("TXSTAGE_BOOTSTRAP_SERVERS", cluster.bootstrap)
    source = create_topic(cluster.bootstrap, unique_name("in"), partitions=2)
    out = create_topic(cluster.bootstrap, unique_name("out"), partitions=2)
    produce_inputs(cluster.bootstrap, source, range(1000), 2)  # offsets 0..499 per partition
    restarted: list[float] = []

    def kill_and_restart() -> None:
        time.sleep(2.0)  # slices are a few hundred records in: well before SLOW_DIES_AT
        cluster.kill(0)
        time.sleep(3.0)
        cluster.restart(0)
        restarted.append(time.monotonic())

    chaos = threading.Thread(target=kill_and_restart, daemon=True)
    chaos.start()
    code, printed, err = backfill(
        "--source", f"kafka://{source}", "--sink", f"kafka://{out}", "--dlq-topic", "",
        "--transform", "tests.harness.backfill_faults:slow_dying_at_450",
        "--transaction-records", "100")
    finished = time.monotonic()
    chaos.join(60)
    assert code == 0, err
    assert restarted and restarted[0] < finished, "the broker came back after the job ended"

    assert_squares_of_inputs(cluster.bootstrap, source, out, 1000)
    # The deaths happened: each first attempt's open transaction (from offset 400 to
    # SLOW_DIES_AT) reached the log and stays invisible.
    written = len(read_uncommitted(cluster.bootstrap, out))
    assert written >= 1000 + 2 * (SLOW_DIES_AT - 400), written
    assert "inputs          1000 (" in printed


def test_a_progress_topic_with_several_partitions_resumes_a_retried_slice_exactly_once(
        new_topic: NewTopic, backfill: Backfill) -> None:
    # Issue 12, defect 2: progress records went where the partitioner put them (by key
    # hash) but were read back from partition 0 only. With a 4-partition progress topic
    # a retried slice found no progress, restarted at its first offset and wrote its
    # committed transactions a second time. (Before that, a progress topic with more
    # than one partition was refused at start: a grown one was not.)
    source, out = new_topic(partitions=4, prefix="in"), new_topic(partitions=2, prefix="out")
    progress_topic = new_topic(partitions=4, config={"cleanup.policy": "compact"},
                               prefix="progress")
    produce_inputs(backfill.bootstrap, source, range(2000), 4)  # offsets 0..499 each

    code, _printed, err = backfill(
        "--source", f"kafka://{source}", "--sink", f"kafka://{out}", "--dlq-topic", "",
        "--progress-topic", progress_topic,
        "--transform", "tests.harness.backfill_faults:crash_on_first_attempt",
        "--transaction-records", "100")
    assert code == 0, err

    expected = expected_outputs(read_topics(backfill.bootstrap, [source]), square,
                                default_topic=out, dlq_topic=None)
    wanted = [parity.Output(p.topic, p.key, p.value, tuple(p.headers)) for p in expected.values()]
    report = parity.compare(wanted, list(parity.from_topics(backfill.bootstrap, [out])))
    assert report.ok, report.problems()
    assert report.actual == 2000
    stored = read_uncommitted(backfill.bootstrap, progress_topic)
    assert stored and {r.partition for r in stored} == {progress.PARTITION}


def test_spark_submit_needs_no_kafka_connector_and_reads_each_slice_in_its_task(
        new_topic: NewTopic, backfill: Backfill) -> None:
    # The tasks read Kafka with librdkafka (service.backfill.slice_reader): spark-submit
    # without --jars runs a Kafka -> Kafka job. The old job read through Spark's Kafka
    # source and refused to start without the connector (exit 2).
    source, out = new_topic(partitions=2, prefix="in"), new_topic(partitions=2, prefix="out")
    produce_inputs(backfill.bootstrap, source, range(400), 2)
    result = subprocess.run(
        [str(Path(sys.executable).with_name("spark-submit")), "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", "service/backfill/__main__.py",
         "--source", f"kafka://{source}", "--sink", f"kafka://{out}", "--dlq-topic", "",
         "--slice-records", "100", "--progress-interval", "0",
         "--bootstrap-servers", backfill.bootstrap],
        cwd=REPO_ROOT, env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                            "TXSTAGE_TRANSFORM": "service.examples.square:square"},
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    expected = expected_outputs(read_topics(backfill.bootstrap, [source]), square,
                                default_topic=out, dlq_topic=None)
    wanted = [parity.Output(p.topic, p.key, p.value, tuple(p.headers)) for p in expected.values()]
    report = parity.compare(wanted, list(parity.from_topics(backfill.bootstrap, [out])))
    assert report.ok and report.actual == 400, report.problems()


def test_a_kafka_sink_refuses_a_spark_that_speculates(new_topic: NewTopic,
                                                     backfill: Backfill) -> None:
    # Issue 12, defect 5: a speculative copy of a slice's task fences the attempt still
    # running (one transactional id per slice); the fenced attempt fails and counts
    # toward spark.task.maxFailures, so a merely slow slice could fail the job. The
    # backfill now refuses speculation for a Kafka sink (exit 2, naming the setting)
    # before anything is written; the old one ran. spark-submit: the session's own
    # configuration, as on a cluster.
    source, out = new_topic(partitions=1, prefix="in"), new_topic(partitions=1, prefix="out")
    produce_inputs(backfill.bootstrap, source, range(10), 1)
    result = subprocess.run(
        [str(Path(sys.executable).with_name("spark-submit")), "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.speculation=true",
         "service/backfill/__main__.py",
         "--source", f"kafka://{source}", "--sink", f"kafka://{out}", "--dlq-topic", "",
         "--progress-interval", "0"],
        cwd=REPO_ROOT, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=300, check=False)
    printed = (result.stdout + result.stderr).splitlines()  # spark-submit mixes them
    errors = [line for line in printed if line.startswith("txstage backfill: error: ")]
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert any("spark.speculation=true" in line for line in errors), errors
    assert end_offsets(backfill.bootstrap, out, isolation="read_uncommitted") == {0: 0}


def test_an_older_attempt_still_running_is_fenced_and_publishes_nothing(
        new_topic: NewTopic, backfill: Backfill) -> None:
    """A zombie (a speculative attempt, an executor cut off but alive): a newer attempt of
    the same slice takes over mid-transaction; the old one fails, its open outputs vanish."""
    source, out = new_topic(partitions=1, prefix="in"), new_topic(partitions=1, prefix="out")
    produce_inputs(backfill.bootstrap, source, range(100), 1)
    inputs = read_topics(backfill.bootstrap, [source])
    flags = config.Flags(parse_source(f"kafka://{source}"), parse_sink(f"kafka://{out}"),
                         job_id="zombie", dlq_topic="", transaction_records=20)
    job_config = config.build(flags, environment())
    progress.ensure_topic(kafka_clients.admin(job_config.kafka()), job_config.progress_topic)
    piece = Slice(0, source, 0, 0, 100)
    sink = tasks.KafkaSinkJob(
        tasks.Processing(job_config.transform, out, None, 1_000_000, job_config.kafka()),
        job_config.kafka(), "zombie", job_config.id_prefix, job_config.progress_topic, 20,
        60_000, 1 << 24, {0: piece})
    old, new = tasks.slice_writer(sink, 0), tasks.slice_writer(sink, 0)

    def feed() -> Iterator[Record]:
        for record in inputs:
            if record.offset == 50:  # old has committed 0..39 and holds 40..49 open
                old.producer._producer.flush(10)  # ...on the broker, not just queued
                assert new.run(lambda _start: inputs).progress.done
            yield record

    with pytest.raises(FencedError):
        old.run(lambda _start: feed())
    old.producer.close()
    new.producer.close()
    assert new.outcome.skipped == 40 and new.outcome.records == 60
    wanted = [parity.Output(p.topic, p.key, p.value, tuple(p.headers)) for p in
              expected_outputs(inputs, square, default_topic=out, dlq_topic=None).values()]
    report = parity.compare(wanted, parity.from_topics(backfill.bootstrap, [out]))
    assert report.ok, report.problems()
    assert len(read_uncommitted(backfill.bootstrap, out)) >= 110  # old's 40..49, aborted


def test_a_poison_record_without_dead_letter_topic_fails_the_job_after_what_came_before(
        new_topic: NewTopic, backfill: Backfill) -> None:
    source, out = new_topic(partitions=1, prefix="in"), new_topic(partitions=1, prefix="out")
    produce_inputs(backfill.bootstrap, source, range(20), 1,
                   value=lambda i: b"x" if i == 7 else str(i).encode())

    code, _, err = backfill("--source", f"kafka://{source}", "--sink", f"kafka://{out}",
                            "--dlq-topic", "", "--transaction-records", "3")
    assert code == 1
    assert f"PoisonRecordError: poison record {source}/0@7" in err
    offsets = [int(dict(o.headers)["txstage.src"].split(b"/")[-1])
               for o in parity.from_topics(backfill.bootstrap, [out])]
    assert offsets == list(range(7))


def test_ranges_by_offsets_and_timestamps_are_fixed_before_spark(
        new_topic: NewTopic, backfill: Backfill) -> None:
    source, out = new_topic(partitions=2, prefix="in"), new_topic(partitions=1, prefix="out")
    producer = Producer({"bootstrap.servers": backfill.bootstrap})
    for i in range(40):
        producer.produce(source, str(i).encode(), partition=i % 2, timestamp=1_000 + i)
    assert producer.flush(10) == 0
    # Partition 0 holds i = 0, 2, ... at offsets 0..19 (timestamps 1000, 1002, ...).
    code, printed, err = backfill("--source", f"kafka://{source}?from=timestamp:1010&to=offsets:0=15",
                                  "--sink", f"kafka://{out}", "--dry-run")
    assert code == 0, err
    assert f"{source}/0" in printed and "5..15" in printed and f"{source}/1" not in printed
    assert "dry run" in printed
    assert end_offsets(backfill.bootstrap, out, isolation="read_uncommitted") == {0: 0}

    code, _, err = backfill("--source", f"kafka://{source}?to=offsets:0=99,1=3",
                            "--sink", f"kafka://{out}")
    assert code == 2 and "offset 99 is past the last stable offset 20" in err


@pytest.mark.parametrize(("source", "message"), [
    ("kafka://no-such-topic-4d2e", "source topic 'no-such-topic-4d2e' does not exist"),
    ("kafka://{topic}?from=offsets:7=0", "has no partition 7"),
])
def test_missing_topics_and_partitions_exit_2(source: str, message: str, new_topic: NewTopic,
                                              backfill: Backfill) -> None:
    topic = new_topic(partitions=1)
    code, _, err = backfill("--source", source.format(topic=topic), "--sink", f"kafka://{topic}-x")
    assert code == 2 and message in err


def test_a_missing_output_topic_exits_2(new_topic: NewTopic, backfill: Backfill) -> None:
    topic = new_topic(partitions=1)
    code, _, err = backfill("--source", f"kafka://{topic}", "--sink", "kafka://absent-out-91")
    assert code == 2 and "output topic 'absent-out-91' does not exist" in err


def test_a_sink_topic_the_sample_reaches_that_does_not_exist_is_refused_even_in_a_dry_run(
        new_topic: NewTopic, backfill: Backfill) -> None:
    # `--topic-suffix -v2` mapped <input>-side to <input>-side-v2, which did not exist:
    # the run said only "sink topic '...' does not exist" (no input, no fix) and the dry
    # run listed the mapping without a word. Now both refuse (exit 2), naming the first
    # input that writes there and the two fixes; nothing is written.
    source = new_topic(partitions=1)
    produce_inputs(backfill.bootstrap, source, range(200), 1)
    out, dlq = new_topic(partitions=1, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")
    side, side_v2 = f"{source}-side", f"{source}-side-v2"
    argv = ("--source", f"kafka://{source}", "--sink", f"kafka://{out}", "--dlq-topic", dlq,
            "--transform", "tests.harness.transforms:square_and_copy_to_side",
            "--topic-suffix", "-v2")
    problem = (f"txstage backfill: error: sink topic {side_v2!r} does not exist: the "
               f"transform writes to {side!r} (first at input {source}/0/0), mapped by "
               f"--topic-suffix -v2: create it (txstage topics create --topic {side_v2}) "
               f"or map {side!r} elsewhere (--topic-map {side}=<sink topic>)")

    code, printed, err = backfill(*argv, "--dry-run")
    assert code == 2 and err.strip().splitlines() == [problem], err
    assert f"-> {side_v2} (--topic-suffix -v2), DOES NOT EXIST" in printed, printed
    code, printed, err = backfill(*argv)
    assert code == 2 and err.strip().splitlines() == [problem], err
    assert ends(backfill.bootstrap, out, dlq) == {out: {0: 0}, dlq: {0: 0}}

    create_topic(backfill.bootstrap, side_v2)  # the fix; the same command resumes the job
    code, printed, err = backfill(*argv)
    assert code == 0, err
    assert sum(ends(backfill.bootstrap, side_v2)[side_v2].values()) >= 200


def test_a_missing_sink_topic_only_a_record_past_the_sample_reaches_dead_letters_it(
        new_topic: NewTopic, backfill: Backfill) -> None:
    # As the stream does (UnknownTopicError): the sample cannot see it, and the other
    # records of the slice are written.
    source = new_topic(partitions=1)
    produce_inputs(backfill.bootstrap, source, range(200), 1)
    out, dlq = new_topic(partitions=1, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")
    argv = ("--source", f"kafka://{source}", "--sink", f"kafka://{out}", "--dlq-topic", dlq,
            "--transform", "tests.harness.transforms:square_and_rare_side",
            "--topic-suffix", "-v2")
    code, _, err = backfill(*argv)
    assert code == 0, err
    [letter] = read_committed(backfill.bootstrap, dlq)
    assert letter.header(ERROR_CLASS) == b"UnknownTopicError", letter
    assert len(read_committed(backfill.bootstrap, out)) == 199


@pytest.mark.parametrize("stage", ["classic"], indirect=True)  # (the stage is a means)
def test_a_fan_out_backfill_never_writes_into_a_live_topic(
        stage: StageSetup, new_topic: NewTopic, backfill: Backfill) -> None:
    # The transform writes its square to the default topic and a copy to <input>-side.
    # `--sink kafka://<out>-v2` wrote every copy into the live side topic: duplicates of
    # what the stage had written there, which the audit then reported. Now an unmapped
    # topic is refused before anything is written (exit 2), and a mapped one goes where
    # it is mapped; the live topics' ends never move.
    transform = "tests.harness.transforms:square_and_copy_to_side"
    side = create_topic(stage.bootstrap, f"{stage.input_topic}-side", partitions=2)
    produce_inputs(stage.bootstrap, stage.input_topic, range(400), PARTITIONS)
    run_stream(stage, transform)
    live = ends(stage.bootstrap, stage.output_topic, stage.dlq_topic, side)
    out, dlq = new_topic(partitions=2, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")
    side_v2 = new_topic(partitions=2, prefix="bf-side")
    argv = ("--source", f"kafka://{stage.input_topic}", "--sink", f"kafka://{out}",
            "--dlq-topic", dlq, "--transform", transform)

    code, printed, err = backfill(*argv)
    assert code == 2, (printed, err)
    assert f"the transform writes to topic {side!r}" in err and "--topic-map" in err, err
    assert ends(stage.bootstrap, out, dlq) == {out: {0: 0, 1: 0}, dlq: {0: 0}}

    code, printed, err = backfill(*argv, "--dry-run")  # the plan, then the run's refusal
    assert code == 2 and "NOT MAPPED" in printed, printed
    assert f"the transform writes to topic {side!r}" in err, err

    code, printed, err = backfill(*argv, "--topic-map", f"{side}={side_v2}")
    assert code == 0, err
    assert ends(stage.bootstrap, stage.output_topic, stage.dlq_topic, side) == live
    assert sum(ends(stage.bootstrap, side_v2)[side_v2].values()) >= 400
    stream = parity.from_topics(stage.bootstrap, [stage.output_topic, stage.dlq_topic, side])
    report = parity.compare(stream, parity.from_topics(stage.bootstrap, [out, dlq, side_v2]),
                            rename={stage.output_topic: out, stage.dlq_topic: dlq,
                                    side: side_v2})
    assert report.ok and report.expected == report.actual == 800, report.problems()


@pytest.mark.parametrize("stage", ["classic"], indirect=True)
def test_verify_after_an_ordinary_redrive_says_equal(
        stage: StageSetup, new_topic: NewTopic, backfill: Backfill) -> None:
    # The stream dead-lettered multiples of 7; the transform was fixed (multiples of 49
    # still fail) and redriven: 85 letters replaced by outputs marked txstage.redriven,
    # 15 written again (attempt 1). A backfill of the fixed transform is what the stream
    # now holds, but verify said DIFFERENT (the redrive marks, the replaced letters).
    fixed = "tests.harness.transforms:square_failing_on_49s"
    produce_inputs(stage.bootstrap, stage.input_topic, range(700), PARTITIONS)
    run_stream(stage, "tests.harness.transforms:square_broken_on_sevens")
    code, done, err = tool(stage, "redrive", env={"TXSTAGE_TRANSFORM": fixed})
    assert code == 0 and (done["redriven"], done["failed_again"]) == (85, 15), (err, done)
    out, dlq = new_topic(partitions=4, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")
    code, printed, err = backfill("--source", f"kafka://{stage.input_topic}",
                                  "--sink", f"kafka://{out}", "--dlq-topic", dlq,
                                  "--transform", fixed)
    assert code == 0, err
    code, printed, _ = backfill(
        "verify", "--expected", f"kafka://{stage.output_topic},{stage.dlq_topic}",
        "--actual", f"kafka://{out},{dlq}", "--topic-map", f"{stage.output_topic}={out}",
        "--topic-map", f"{stage.dlq_topic}={dlq}", "--job-id", backfill.job_id(printed))
    assert code == 0 and printed.startswith("EQUAL: 700 outputs match"), printed
