"""``txstage audit`` against a real broker and a real stage: clean while the
stage runs and its input grows, and each planted violation found — a duplicated output,
a lost input (offsets committed past it, no output), an output without an input, and a
transaction a stopped foreign producer leaves open on an output partition.

Takes ≈ 36 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from service.kafka import reading
from tests.harness.admin import create_topic
from tests.harness.kafka import KafkaService
from tests.harness.operator_tools import foreign_transaction, tool, violations
from tests.harness.reading import read_committed
from tests.harness.stage import (
    PARTITIONS,
    StageSetup,
    build_stage,
    produce_inputs,
    samples,
    value,
    wait_for,
)
from tests.harness.transforms import tenth_to_a_missing_topic

pytestmark = pytest.mark.kafka


def poison(i: int) -> bytes:
    return b"not a number" if i % 101 == 0 else str(i).encode()


def audit(setup: StageSetup, *args: str) -> tuple[int, dict[str, object], str]:
    return tool(setup, "audit", "--timeout", "90", *args)


@pytest.fixture
def settled(kafka: KafkaService, unique_name: Callable[[str], str],
            tmp_path: Path) -> Iterator[StageSetup]:
    """A stage that processed 1,500 records (with poison), then stopped cleanly."""
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path)
    produce_inputs(setup.bootstrap, setup.input_topic, range(1500), PARTITIONS, value=poison)
    replica = setup.replica("r1")
    setup.wait_committed()
    assert replica.terminate() == 0
    yield setup
    for started in setup.started:
        started.kill()


def test_the_audit_is_clean_while_the_stage_runs_and_its_input_grows(
        kafka: KafkaService, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path)
    try:
        _audit_while_the_input_grows(setup)
    finally:
        for started in setup.started:  # the replica must not outlive the test
            started.kill()


def _audit_while_the_input_grows(setup: StageSetup) -> None:
    produce_inputs(setup.bootstrap, setup.input_topic, range(3000), PARTITIONS, value=poison)
    setup.replica("r1")
    setup.wait_committed()
    feeding = threading.Event()

    def feed() -> None:
        i = 3000
        while not feeding.is_set():
            produce_inputs(setup.bootstrap, setup.input_topic, range(i, i + 200), PARTITIONS,
                           value=poison)
            i += 200
            time.sleep(0.05)
    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        code, report, err = audit(setup, "--stuck-after", "3")
    finally:
        feeding.set()
        feeder.join()
    assert code == 0, (err, report)
    assert violations(report) == {}
    assert isinstance(report["inputs"], int) and report["inputs"] >= 3000
    assert report["expected_outputs"] == report["inputs"]  # one output (or dead letter) each
    assert report["outputs_read"] >= report["inputs"]


def test_committed_offsets_held_by_an_open_transaction_are_waited_out(
        kafka: KafkaService, unique_name: Callable[[str], str]) -> None:
    # The audit reads the group's committed offsets with RequireStable. While a
    # transaction holds offsets for a partition the broker answers
    # UNSTABLE_OFFSET_COMMIT, and a running exactly-once stage has one open most of
    # the time: the audit used to give up ("could not finish", exit 4; seen in CI).
    topic, group = unique_name("in"), unique_name("group")
    create_topic(kafka.bootstrap, topic, partitions=1)
    member = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    producer = Producer({"bootstrap.servers": kafka.bootstrap,
                         "transactional.id": unique_name("txn")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 7)],
                                         member.consumer_group_metadata(), 30)
    answer: list[object] = []
    reader = threading.Thread(target=lambda: answer.append(_committed_or_error(
        kafka.bootstrap, group, topic)))
    reader.start()
    time.sleep(1.5)  # the read meets the open transaction
    assert not answer, f"answered while the transaction was open: {answer}"
    producer.commit_transaction(30)
    reader.join(30)
    member.close()
    assert answer == [{(topic, 0): 7}]


def test_committed_offsets_are_read_by_a_group_consumer_never_the_admin_client(
        kafka: KafkaService, unique_name: Callable[[str], str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The audit and redrive read committed offsets with AdminClient's
    # ListConsumerGroupOffsets, which crashes the process (SIGSEGV, librdkafka#5040)
    # when the group coordinator moves: the audit CronJob died of what the stage's
    # own read-back was fixed for. They now ask as the stage does.
    topic, group = unique_name("in"), unique_name("group")
    create_topic(kafka.bootstrap, topic, partitions=2)
    member = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    member.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    member.close()

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("ListConsumerGroupOffsets through the AdminClient")

    monkeypatch.setattr(AdminClient, "list_consumer_group_offsets", refused)
    found = reading.committed({"bootstrap.servers": kafka.bootstrap}, group,
                              [(topic, 0), (topic, 1)], timeout_s=30)
    assert found == {(topic, 0): 5, (topic, 1): -1001}


def _committed_or_error(bootstrap: str, group: str, topic: str) -> object:
    try:
        return reading.committed({"bootstrap.servers": bootstrap}, group, [(topic, 0)])
    except Exception as exc:  # the test asserts what came back
        return exc


def plant_a_loss(setup: StageSetup) -> str:
    """A new input on partition 3 the group's offset is committed past, with no output:
    its coordinates."""
    producer = Producer({"bootstrap.servers": setup.bootstrap})
    producer.produce(setup.input_topic, b"12345", b"lost", partition=3)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": setup.group_id})
    [position] = consumer.committed([TopicPartition(setup.input_topic, 3)], timeout=30)
    consumer.commit(offsets=[TopicPartition(setup.input_topic, 3, position.offset + 1)],
                    asynchronous=False)
    consumer.close()
    return f"{setup.input_topic}/3/{position.offset}"


def test_a_planted_duplicate_a_lost_input_and_an_orphan_output_are_each_found(
        settled: StageSetup) -> None:
    setup = settled
    code, report, err = audit(setup, "--stuck-after", "1")
    assert code == 0 and violations(report) == {}, (err, report)

    # A duplicate: one output written again, lineage headers and all.
    original = read_committed(setup.bootstrap, setup.output_topic)[7]
    producer = Producer({"bootstrap.servers": setup.bootstrap})
    producer.produce(setup.output_topic, original.value, original.key,
                     partition=original.partition, headers=original.headers)
    # An orphan: an output that names no input.
    producer.produce(setup.output_topic, b"orphan", b"k", partition=0)
    assert producer.flush(30) == 0
    lost = plant_a_loss(setup)

    code, report, err = audit(setup, "--stuck-after", "1")
    assert code == 1, (err, report)
    # The copy, appended after newer outputs, is also out of input order.
    assert violations(report) == {"duplicate": 1, "out_of_order": 1, "unexpected": 1,
                              "missing": 1}, report
    found = report["violations"]
    assert isinstance(found, dict)
    lineage = dict(original.headers)["txstage.src"].decode()
    assert lineage in found["duplicate"]["examples"][0]
    assert found["missing"]["examples"] == [lost]
    assert "no lineage headers" in found["unexpected"]["examples"][0]


def test_a_transaction_a_stopped_foreign_producer_holds_open_is_found_hanging(
        settled: StageSetup) -> None:
    setup = settled
    with foreign_transaction(setup):
        code, report, err = audit(setup, "--stuck-after", "3")
    assert code == 1, (err, report)
    assert violations(report) == {"hanging": 1}, report
    found = report["violations"]
    assert isinstance(found, dict)
    assert found["hanging"]["examples"][0].startswith(f"{setup.output_topic}/1: ")


def test_the_stuck_lso_metric_moves_when_a_foreign_transaction_hangs_on_an_output(
        kafka: KafkaService, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path)
    produce_inputs(setup.bootstrap, setup.input_topic, range(200), PARTITIONS)
    replica = setup.replica("r1", TXSTAGE_LSO_CHECK_INTERVAL_S="1",
                            TXSTAGE_STATISTICS_INTERVAL_MS="1000")
    setup.wait_committed()
    try:
        with foreign_transaction(setup):
            # Records above the held LSO: the stage keeps writing to every output partition.
            produce_inputs(setup.bootstrap, setup.input_topic, range(200, 400), PARTITIONS)
            held = {"role": "output", "topic": setup.output_topic, "partition": "1"}
            wait_for(lambda: value(replica, "txstage_lso_stuck_seconds", **held) >= 4, 60,
                     "the stuck-LSO gauge of the held partition to pass 4 s", setup.diagnose)
            assert value(replica, "txstage_lso_lag_records", **held) > 0
            for partition in ("0", "2", "3"):  # written to and committed: never stuck long
                assert value(replica, "txstage_lso_stuck_seconds", role="output",
                             topic=setup.output_topic, partition=partition) < 4
            assert any(name == "txstage_producer_transaction_state_seconds"
                       for name, _ in samples(replica)), "no state from librdkafka statistics"
    finally:
        replica.kill()


def test_a_fan_out_pipeline_audits_clean_with_the_stages_settings_alone(
        kafka: KafkaService, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    # service.examples.fanout writes a summary to a second topic. The audit read only
    # TXSTAGE_OUTPUT_TOPIC and the DLQ: every summary was "missing", VIOLATED, unless
    # the operator remembered --extra-output-topic (the k8s CronJob does not pass it).
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path)
    summaries = create_topic(setup.bootstrap, unique_name("summary"), partitions=2)
    setup.env |= {"TXSTAGE_TRANSFORM": "service.examples.fanout:split_lines",
                  "TXSTAGE_EXAMPLE_SUMMARY_TOPIC": summaries}
    produce_inputs(setup.bootstrap, setup.input_topic, range(400), PARTITIONS,
                   value=lambda i: f"{i}\n{i * 2}".encode())
    replica = setup.replica("r1")
    try:
        setup.wait_committed()
        assert replica.terminate() == 0
        code, report, err = audit(setup, "--stuck-after", "1")
        assert (code, violations(report)) == (0, {}), (err, report)
        assert report["learned_topics"] == [summaries]
        assert report["expected_outputs"] == 1200
        # A duplicate planted in the second topic is still found.
        original = read_committed(setup.bootstrap, summaries)[0]
        producer = Producer({"bootstrap.servers": setup.bootstrap})
        producer.produce(summaries, original.value, original.key, headers=original.headers)
        assert producer.flush(10) == 0
        code, report, _ = audit(setup, "--stuck-after", "1")
        # (Appended at the end, it is out of order as well.)
        assert code == 1 and violations(report).get("duplicate") == 1, report
    finally:
        replica.kill()


def test_the_documented_verifier_is_clean_on_write_time_letters_and_a_redrive(
        kafka: KafkaService, unique_name: Callable[[str], str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs offered service.tools.verify for checking exactly-once yourself. On a
    pipeline with dead letters written at write time (outputs to a topic that does not
    exist), then redriven, it reported them missing, different, duplicated and out of
    order. The audit is the one documented verifier: clean here, and a duplicate of a
    redriven output and a lost input planted beside them are still found; the internal
    oracle sets those records aside instead of judging them falsely."""
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path)
    missing = unique_name("later")
    setup.env |= {"TXSTAGE_TRANSFORM": "tests.harness.transforms:tenth_to_a_missing_topic",
                  "TEST_MISSING_TOPIC": missing}
    monkeypatch.setenv("TEST_MISSING_TOPIC", missing)  # the oracle runs it here too
    produce_inputs(setup.bootstrap, setup.input_topic, range(800), PARTITIONS)
    replica = setup.replica("r1")
    setup.wait_committed()
    assert replica.terminate() == 0

    def oracle() -> None:
        report = setup.verify(tenth_to_a_missing_topic, extra_outputs=tuple(
            t for t in (missing,) if t in AdminClient(
                {"bootstrap.servers": setup.bootstrap}).list_topics(timeout=30).topics))
        assert not (report.missing or report.mismatched or report.duplicates
                    or report.out_of_order or report.unexpected), report.problems()
        assert report.unjudged, "no record was set aside: the scenario is not there"

    code, report, err = audit(setup, "--stuck-after", "1")
    assert (code, violations(report)) == (0, {}), (err, report)
    assert report["letters_pending"] == 0, report
    oracle()

    create_topic(setup.bootstrap, missing, partitions=2)
    code, done, err = tool(setup, "redrive")
    assert code == 0 and done["redriven"] == 80 and done["failed_again"] == 0, (err, done)
    code, report, err = audit(setup, "--stuck-after", "1")
    assert (code, violations(report)) == (0, {}), (err, report)
    assert report["learned_topics"] == [missing], report
    oracle()

    # A duplicate of a redriven output (redrive's mark and the original's lineage) and
    # a new input the group's offset is committed past, with no output.
    [copied] = read_committed(setup.bootstrap, missing)[:1]
    producer = Producer({"bootstrap.servers": setup.bootstrap, "enable.idempotence": True})
    producer.produce(missing, copied.value, copied.key, partition=copied.partition,
                     headers=copied.headers)
    assert producer.flush(30) == 0
    lost = plant_a_loss(setup)
    code, report, err = audit(setup, "--stuck-after", "1")
    assert code == 1 and violations(report) == {"duplicate": 1, "missing": 1}, (err, report)
    assert report["violations"]["missing"]["examples"] == [lost]  # type: ignore[index]
