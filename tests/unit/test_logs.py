"""Logging: JSON lines on stdout, contextvars bound, stdlib and librdkafka routed through."""

from __future__ import annotations

import json
import logging
import re
import warnings
from collections.abc import Iterator

import pytest
import structlog
from confluent_kafka import KafkaError
from structlog.testing import capture_logs

from service.observability import logs
from service.observability.logs import configure_logging, error_cb, librdkafka_logger

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Leave structlog and the root logger as found: other tests share the process.
    A fresh folder too: a line another test logged is no repeat here."""
    monkeypatch.setattr(logs, "FOLDER", logs.Folder(background=False))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    structlog.contextvars.clear_contextvars()
    try:
        yield
    finally:
        structlog.reset_defaults()
        structlog.contextvars.clear_contextvars()
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.captureWarnings(False)


def json_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    """Every stdout line, each parsed as JSON (fails if any line is not JSON)."""
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines()]


def test_each_line_is_json_with_the_standard_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    structlog.get_logger("txstage.loop").info("started", replicas=2)
    [line] = json_lines(capsys)
    assert line["event"] == "started"
    assert line["replicas"] == 2
    assert line["level"] == "info"
    assert line["logger"] == "txstage.loop"
    assert isinstance(line["timestamp"], str)
    assert ISO_UTC.match(line["timestamp"])


def test_bound_contextvars_appear_on_every_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    log = structlog.get_logger("txstage.commit")
    with structlog.contextvars.bound_contextvars(partition=3, transactional_id="g.in.3"):
        log.info("commit_started")
        logging.getLogger("some.library").warning("retrying %s", "metadata")
    log.info("after")
    first, second, third = json_lines(capsys)
    for line in (first, second):
        assert (line["partition"], line["transactional_id"]) == (3, "g.in.3")
    assert second["event"] == "retrying metadata"
    assert "partition" not in third


def test_stdlib_records_come_out_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    logging.getLogger("py4j").error("gateway %s", "down", extra={"attempt": 2})
    [line] = json_lines(capsys)
    assert line["event"] == "gateway down"
    assert line["level"] == "error"
    assert line["logger"] == "py4j"
    assert line["attempt"] == 2
    assert ISO_UTC.match(str(line["timestamp"]))


def explode() -> None:
    raise RuntimeError("transform exploded")


def test_exceptions_are_rendered_into_the_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    log = structlog.get_logger("txstage")
    try:
        explode()
    except RuntimeError:
        log.exception("transform_failed")
    [line] = json_lines(capsys)
    assert line["level"] == "error"
    assert "Traceback" in str(line["exception"])
    assert "RuntimeError: transform exploded" in str(line["exception"])


def test_level_filters_lower_records(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", level="warning")
    structlog.get_logger("txstage").info("hidden")
    logging.getLogger("other").info("hidden too")
    structlog.get_logger("txstage").warning("shown")
    assert [line["event"] for line in json_lines(capsys)] == ["shown"]


def test_configuring_twice_does_not_duplicate_lines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("console")
    configure_logging("json")
    structlog.get_logger("txstage").info("once")
    assert [line["event"] for line in json_lines(capsys)] == ["once"]


def test_console_format_is_human_readable_not_json(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("console")
    structlog.get_logger("txstage").info("hello_console", partition=1)
    out = capsys.readouterr().out
    assert "hello_console" in out
    assert "partition" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.splitlines()[0])


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="log format"):
        configure_logging("xml")  # type: ignore[arg-type]


def test_warnings_are_routed_to_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old api", DeprecationWarning, stacklevel=1)
    [line] = json_lines(capsys)
    assert line["logger"] == "py.warnings"
    assert "old api" in str(line["event"])


def test_librdkafka_logger_records_end_up_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    logger = librdkafka_logger("producer-in-3")
    # What confluent_kafka calls for each librdkafka log line.
    logger.log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#producer-7", "broker down")
    [line] = json_lines(capsys)
    assert isinstance(logger, logging.Logger)
    assert line["logger"] == "txstage.librdkafka.producer-in-3"
    assert line["event"] == "FAIL [rdkafka#producer-7] broker down"
    assert line["level"] == "warning"


def test_error_cb_logs_the_kafka_error_fields() -> None:
    on_error = error_cb("consumer")
    err = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down", fatal=False)
    with capture_logs() as captured:
        on_error(err)
    assert captured == [{
        "event": "kafka_client_error", "log_level": "warning", "client": "consumer",
        "code": "_ALL_BROKERS_DOWN", "reason": "1/1 brokers are down",
        "fatal": False, "retriable": False,
    }]


def test_error_cb_logs_fatal_errors_at_error_level() -> None:
    # (A fence is fatal too, but expected: a warning, see test_librdkafka_log.py.)
    err = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                     "Transactional Id authorization failed", fatal=True)
    with capture_logs() as captured:
        error_cb("producer-in-0")(err)
    [entry] = captured
    assert (entry["log_level"], entry["fatal"], entry["code"]) == \
        ("error", True, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")


def test_error_cb_output_is_json_with_contextvars(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    err = KafkaError(KafkaError._TRANSPORT, "connection reset", retriable=True)
    with structlog.contextvars.bound_contextvars(transactional_id="g.in.1"):
        error_cb("producer-in-1")(err)
    [line] = json_lines(capsys)
    assert line["logger"] == "txstage.kafka"
    assert line["transactional_id"] == "g.in.1"
    assert line["retriable"] is True


def test_error_cb_never_raises(capsys: pytest.CaptureFixture[str]) -> None:
    """Not even when given something that is not a KafkaError (it falls back to stderr)."""
    configure_logging("json")
    error_cb("consumer")(object())  # type: ignore[arg-type]
    assert "kafka client consumer error" in capsys.readouterr().err


def test_error_cb_never_raises_when_logging_itself_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise OSError("stdout is gone")

    monkeypatch.setattr(structlog.stdlib.BoundLogger, "log", broken)
    configure_logging("json")
    error_cb("consumer")(KafkaError(KafkaError._TRANSPORT, "reset"))
    assert "_TRANSPORT" in capsys.readouterr().err
