"""Bad settings and bad transforms exit 2 naming the problem, before any record is
touched; a poison record without a dead-letter topic fails the replica (exit 3)
after bounded retries, with the record's coordinates in the log.

Takes ≈ 44 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from service.tools.verify import committed_offsets
from tests.harness.stage import PARTITIONS, REPO_ROOT, StageSetup, produce_inputs

pytestmark = pytest.mark.kafka


def txstage(command: str, env: dict[str, str],
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")}
    return subprocess.run([sys.executable, "-m", "service", command], cwd=REPO_ROOT,
                          env={**clean, **env, "TXSTAGE_METRICS_PORT": "0"},
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_check_config_accepts_a_good_setup(stage: StageSetup) -> None:
    result = txstage("check-config", stage.env)
    assert result.returncode == 0, result.stderr
    assert "configuration OK" in result.stdout


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"TXSTAGE_TRANSFORM": "no.such.module:fn"}, "cannot import module 'no.such.module'"),
        ({"TXSTAGE_TRANSFORM": "service.examples.square:nope"}, "has no attribute 'nope'"),
        ({"TXSTAGE_INPUT_TOPICS": "no-such-input"},
         "TXSTAGE_INPUT_TOPICS: topic 'no-such-input' does not exist"),
        ({"TXSTAGE_DLQ_TOPIC": "no-such-dlq"}, "TXSTAGE_DLQ_TOPIC: topic 'no-such-dlq'"),
        ({"TXSTAGE_TRANSACTION_TIMEOUT_MS": "3600000"},
         "above the broker's transaction.max.timeout.ms=900000"),
        ({"TXSTAGE_KAFKA__ISOLATION_LEVEL": "read_uncommitted"}, "isolation.level cannot be set"),
        ({"TXSTAGE_CONSUMER__ENABLE_AUTO_COMMIT": "true"}, "enable.auto.commit cannot be set"),
        ({"TXSTAGE_COMMIT_INTERVAL_MS": "20000"}, "at most a tenth"),
        ({"TXSTAGE_METRICS_PORT_X": "1", "TXSTAGE_BATCH_SIZE": "lots"}, "TXSTAGE_BATCH_SIZE"),
        # Each accepted alone, refused together by librdkafka (a traceback, exit 1, once):
        ({"TXSTAGE_PRODUCER__MESSAGE_TIMEOUT_MS": "120000"},
         "`message.timeout.ms` must be set <= `transaction.timeout.ms`"),
    ],
)
@pytest.mark.parametrize("command", ["run", "check-config"])
def test_bad_settings_exit_2_naming_the_problem(stage: StageSetup, command: str,
                                                override: dict[str, str], fragment: str) -> None:
    result = txstage(command, {**stage.env, **override})
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert fragment in result.stderr, result.stderr
    assert committed_offsets(stage.bootstrap, stage.group_id, [stage.input_topic]) == {
        (stage.input_topic, p): -1001 for p in range(PARTITIONS)}, "nothing may be touched"


def test_oversized_producer_limit_for_the_output_topic_exits_2(
        stage: StageSetup, new_topic: object) -> None:
    small = new_topic(1, {"max.message.bytes": "10000"}, prefix="small")  # type: ignore[operator]
    told = {**stage.env, "TXSTAGE_OUTPUT_TOPIC": small,
            "TXSTAGE_PRODUCER__MESSAGE_MAX_BYTES": "1000000"}
    result = txstage("check-config", told)
    assert result.returncode == 2
    assert (f"exceeds topic '{small}' max.message.bytes=10000: "
            f"set TXSTAGE_PRODUCER__MESSAGE_MAX_BYTES=10000") in result.stderr
    # Unset, the producers are sized from the topics: each output still checked
    # against its own topic's limit.
    result = txstage("check-config", {**stage.env, "TXSTAGE_OUTPUT_TOPIC": small})
    assert result.returncode == 0, result.stderr


def test_an_input_larger_than_the_dead_letter_topic_holds_is_a_warning(
        stage: StageSetup, new_topic: object) -> None:
    large = new_topic(1, {"max.message.bytes": "5000000"}, prefix="large")  # type: ignore[operator]
    result = txstage("check-config", {**stage.env, "TXSTAGE_INPUT_TOPICS": large})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "txstage: configuration OK\n"
    [warning] = [line for line in result.stderr.splitlines() if "config warning" in line]
    assert warning == (
        f"txstage: config warning: input topic '{large}' max.message.bytes=5000000 is larger "
        f"than the dead-letter topic '{stage.dlq_topic}' holds (1048588 bytes: its "
        f"max.message.bytes=1048588, the producer's message.max.bytes=1048588): a larger "
        f"record is dead-lettered without its value and cannot be redriven; raise topic "
        f"'{stage.dlq_topic}' max.message.bytes to 5000000")
    result = txstage("check-config", stage.env)  # inputs at the topic default: no warning
    assert "config warning" not in result.stderr, result.stderr


def test_a_second_replica_on_a_taken_metrics_port_exits_2_in_one_line(
        stage: StageSetup) -> None:
    # It died with a 26-line OSError traceback and exit 1, after the cluster checks.
    with socket.socket() as first:  # the first replica's metrics port
        first.bind(("0.0.0.0", 0))
        first.listen()
        port = first.getsockname()[1]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")}
        result = subprocess.run([sys.executable, "-m", "service", "run"], cwd=REPO_ROOT,
                                env={**clean, **stage.env, "TXSTAGE_METRICS_PORT": str(port)},
                                capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert (result.stdout, len(result.stderr.splitlines())) == ("", 1), result.stderr
    assert result.stderr.startswith(f"txstage: config error: TXSTAGE_METRICS_PORT={port}: "
                                    f"cannot serve /metrics on 0.0.0.0:{port}: "), result.stderr


def test_missing_required_settings_are_listed_one_per_line() -> None:
    result = txstage("run", {"TXSTAGE_GROUP_ID": "g"})
    assert result.returncode == 2
    # One line each, and nothing else: no conflict between two missing topics.
    assert result.stderr.splitlines() == [
        f"txstage: config error: TXSTAGE_{name}: Field required"
        for name in ("BOOTSTRAP_SERVERS", "INPUT_TOPICS", "OUTPUT_TOPIC", "TRANSFORM")]


def test_poison_record_without_dlq_fails_after_bounded_retries(stage: StageSetup) -> None:
    produce_inputs(stage.bootstrap, stage.input_topic, range(400), PARTITIONS,
                   value=lambda i: b"oops" if i == 203 else str(i).encode())
    env = {**stage.env, "TXSTAGE_DLQ_TOPIC": "", "TXSTAGE_MAX_RECORD_ATTEMPTS": "3",
           "TXSTAGE_RETRY_BACKOFF_MS": "50"}
    result = txstage("run", env, timeout=120)
    assert result.returncode == 3, result.stdout[-3000:]
    failed = [line for line in result.stdout.splitlines() if '"stage.failed"' in line]
    assert failed and '"offset": 25' in failed[0]
    assert f'"partition": {203 % PARTITIONS}' in failed[0]
    assert result.stdout.count('"record.poison"') == 3
    # Every record before the poison one in its partition was committed; nothing after.
    committed = committed_offsets(stage.bootstrap, stage.group_id, [stage.input_topic])
    assert committed[(stage.input_topic, 203 % PARTITIONS)] == 203 // PARTITIONS
