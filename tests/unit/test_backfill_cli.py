"""Bad arguments exit 2 with one clear line per problem, before Kafka or Spark is touched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service import cli
from service.backfill import main
from service.backfill.cli import describe_failure
from tests.harness.doc_commands import commands, sh_blocks

ENV = {"TXSTAGE_TRANSFORM": "service.examples.square:square", "TXSTAGE_OUTPUT_TOPIC": "out",
       "TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1"}


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in ("TXSTAGE_DLQ_TOPIC", "TXSTAGE_GROUP_ID", "TXSTAGE_TRANSACTIONAL_ID_PREFIX",
                 "TXSTAGE_TRANSACTION_TIMEOUT_MS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--source", "s3://bucket/in", "--sink", "kafka"], "unknown scheme 's3'"),
        (["--source", "kafka://", "--sink", "kafka"], "the topic is missing"),
        (["--source", "kafka://in?from=offsets:0=50&to=offsets:0=10", "--sink", "kafka"],
         "partition 0 ends at offset 10, before its start 50"),
        (["--source", "kafka://in?from=timestamp:2000&to=timestamp:1000", "--sink", "kafka"],
         "before the start timestamp"),
        (["--source", "kafka://in", "--sink", "ftp://x"], "unknown scheme 'ftp'"),
        (["--source", "kafka://in"], "the following arguments are required: --sink"),
        (["--source", "kafka://in", "--sink", "kafka", "--slice-records", "0"],
         "must be positive"),
        (["--source", "kafka://in", "--sink", "kafka", "--colour"], "unrecognized arguments"),
        (["--source", "kafka://in", "--sink", "kafka://v2", "--job-id", "a b"],
         "--job-id 'a b'"),
        (["--source", "kafka://in", "--sink", "kafka://v2", "--transaction-ms", "9000"],
         "at most a tenth of TXSTAGE_TRANSACTION_TIMEOUT_MS=60000"),
        (["--source", "kafka://in", "--sink", "kafka://a", "--output-topic", "b"], "disagree"),
        (["--source", "kafka://out", "--sink", "kafka", "--topic-map", "out=out"],
         "TXSTAGE_OUTPUT_TOPIC must not be one of the input topics"),
        (["--source", "kafka://in", "--sink", "kafka"],
         "the default output topic 'out' comes from TXSTAGE_OUTPUT_TOPIC"),
        (["--source", "kafka://in", "--sink", "kafka://v2", "--topic-map", "side"],
         "--topic-map 'side': expected <topic>=<sink topic>"),
        (["--source", "jsonl:///in", "--sink", "kafka", "--conf", "novalue"],
         "expected KEY=VALUE"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    lines = errors(capsys)
    assert any(message in line for line in lines), lines
    assert all(line.startswith("txstage backfill: error: ") for line in lines)


def test_every_missing_setting_is_listed(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TXSTAGE_TRANSFORM")
    monkeypatch.delenv("TXSTAGE_OUTPUT_TOPIC")
    assert main(["--source", "parquet:///in", "--sink", "parquet:///out"]) == 2
    lines = errors(capsys)
    assert len(lines) == 2
    assert "no output topic" in lines[0] and "no transform" in lines[1]


def test_a_kafka_source_needs_bootstrap_servers(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TXSTAGE_BOOTSTRAP_SERVERS")
    assert main(["--source", "kafka://in", "--sink", "parquet:///out"]) == 2
    assert "needs TXSTAGE_BOOTSTRAP_SERVERS" in errors(capsys)[0]


def test_an_unloadable_transform_exits_2_before_spark(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--source", "jsonl:///nowhere", "--sink", "parquet:///out", "--transform", "no.such:f"]
    assert main(argv) == 2
    assert "cannot import module 'no.such'" in errors(capsys)[0]


def test_a_passthrough_that_voids_the_guarantee_exits_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TXSTAGE_KAFKA__ISOLATION_LEVEL", "read_uncommitted")
    assert main(["--source", "kafka://in", "--sink", "kafka://v2"]) == 2
    assert "isolation.level cannot be set" in errors(capsys)[0]


def test_verify_needs_known_forms(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--expected", "kafka://", "--actual", "parquet:///x"]) == 2
    assert "name the topics" in errors(capsys)[0]


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--source" in capsys.readouterr().out


def test_a_spark_task_failure_is_reported_by_its_python_error() -> None:
    spark_error = RuntimeError(
        "An error occurred while calling o99.collectToPython.\n"
        "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
        "service.errors.PoisonRecordError: poison record in/0@7: ValueError: bad\n"
        "\tat org.apache.spark.api.python...")
    assert describe_failure(spark_error) == \
        "PoisonRecordError: poison record in/0@7: ValueError: bad"
    assert describe_failure(ValueError("plain")) == "ValueError: plain"


def test_an_unmapped_topic_met_inside_a_spark_task_exits_2_naming_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The driver's sample missed it (a topic written by a rare record): the task raised
    # before its transaction committed, and Spark reports the Python traceback.
    from service.backfill import job

    def failed(_config: object) -> int:
        raise RuntimeError("Job aborted due to stage failure: ... Traceback (most recent "
                           "call last):\n  File ...\nservice.backfill.topic_map."
                           "UnmappedTopicError: the transform writes to topic 'rare', which "
                           "this backfill does not map: add --topic-map rare=<sink topic>\n")
    monkeypatch.setattr(job, "run", failed)
    assert main(["--source", "kafka://in", "--sink", "kafka://v2"]) == 2
    [line] = errors(capsys)
    assert line == ("txstage backfill: error: the transform writes to topic 'rare', which "
                    "this backfill does not map: add --topic-map rare=<sink topic>")


def docs_commands() -> list[list[str]]:
    """Every ``txstage backfill`` command docs/backfill.md shows, a placeholder
    (``<the job id step 1 printed>``) as one word."""
    return [argv for block in sh_blocks("docs/backfill.md")
            for argv in commands(re.sub(r"<[^>\n]*>", "placeholder", block))
            if argv[:2] == ["txstage", "backfill"]]


def test_every_command_the_backfill_docs_show_parses_as_written() -> None:
    # `--topic-suffix -v2` failed: argparse took -v2 for an option ("expected one
    # argument"). (The suffix command also runs against a broker and Spark:
    # tests/integration/test_backfill_docs.py.)
    found = docs_commands()
    assert len(found) >= 8 and any("--topic-suffix" in argv for argv in found)
    for argv in found:
        args = cli.parser().parse_args(argv[1:])
        if "--topic-suffix" in argv:
            assert args.topic_suffix == argv[argv.index("--topic-suffix") + 1] == "-v2"


@pytest.mark.parametrize(("argv", "expected"), [
    (["verify", "--expected", "kafka://a", "--actual", "kafka://b", "--topic-suffix", "-v2"],
     {"topic_suffix": "-v2"}),
    (["--source", "kafka://a", "--sink", "kafka://-b", "--dlq-topic", "-dead", "--topic-map",
      "-side=-side-v2", "--job-id", "-j", "--output-topic", "-out", "--topic-suffix", "-v2"],
     {"sink": "kafka://-b", "dlq_topic": "-dead", "topic_map": ["-side=-side-v2"],
      "job_id": "-j", "output_topic": "-out", "topic_suffix": "-v2"}),
])
def test_a_value_may_start_with_a_dash(argv: list[str], expected: dict[str, object]) -> None:
    # Kafka topic names, suffixes and job ids may start with '-'.
    args = vars(cli.parser().parse_args(["backfill", *argv]))
    assert {name: args[name] for name in expected} == expected


def test_an_option_followed_by_another_still_lacks_its_value(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--source", "kafka://a", "--sink", "kafka", "--job-id", "--dry-run"]) == 2
    assert errors(capsys) == ["txstage backfill: error: argument --job-id: expected one "
                              "argument"]
