"""``txstage audit`` and ``txstage redrive`` exit as the stage does on bad settings: 2,
naming what is wrong, not 4 ("could not finish", which for redrive says a rerun
resumes). Settings librdkafka refuses in combination and a missing permission both
used to come out of the tools as 4."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from service.errors import DeniedError, Where
from service.exit_codes import ExitCode
from service.tools.audit import cli as audit_cli
from service.tools.common import run_tool
from service.tools.redrive import cli as redrive_cli

ENV = {"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TXSTAGE_GROUP_ID": "g",
       "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
       "TXSTAGE_DLQ_TOPIC": "dlq", "TXSTAGE_TRANSFORM": "service.examples.square:square",
       "TXSTAGE_KAFKA__SECURITY_PROTOCOL": "sasl_ssll"}  # a typo librdkafka refuses


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no .env
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("tool", "argv"), [(audit_cli.main, ["--json"]),
                                            (redrive_cli.main, [])])
def test_a_tool_exits_2_naming_what_librdkafka_refuses(
        tool: object, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = tool(argv)  # type: ignore[operator]
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG, err
    assert "security.protocol" in err and "could not finish" not in err


def test_a_missing_permission_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    def body() -> int:
        raise DeniedError(Where("produce", None, "out", 0),
                          KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))

    assert run_tool("redrive", body, unfinished_hint=" (a rerun resumes)") == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "permission denied" in err and "could not finish" not in err


def test_an_unexpected_exception_is_a_bug_with_its_traceback_not_the_cluster(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Any RuntimeError used to read as "could not finish" (exit 4): a programming error
    # in a tool looked like a cluster problem, and its traceback was lost.
    def body() -> int:
        raise RuntimeError("a bug in the tool")

    assert run_tool("audit", body) == ExitCode.BUG == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "a bug in the tool" in err
    assert "could not finish" not in err and "the cluster is not the cause" in err


def test_a_kafka_failure_keeps_its_one_line_and_exit_4(
        capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import KafkaException

    def body() -> int:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    assert run_tool("audit", body) == ExitCode.UNFINISHED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("txstage audit: could not finish: ")
    assert "broker down" in err
