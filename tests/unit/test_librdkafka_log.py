"""librdkafka's log and error_cb's errors: levels that mean something, repeats folded.

Driven the way confluent_kafka drives them: ``logger.log(level, "%s [%s] %s",
facility, client instance, message)`` on the stdlib logger :func:`librdkafka_logger`
returns (syslog levels already mapped: EMERG/ALERT/CRIT -> CRITICAL, ERR -> ERROR,
WARNING -> WARNING, NOTICE/INFO -> INFO), and the ``error_cb`` callable with a
``KafkaError``. The messages are librdkafka 2.x's own wording.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import structlog
from confluent_kafka import KafkaError

from service.observability import logs
from service.observability.logs import Folder, configure_logging, error_cb, librdkafka_logger

REFUSED = ("[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 "
           "failed: Connection refused (after {ms}ms in state CONNECT{suppressed})")
FENCED_TXNERR = ("[thrd:main]: Fatal transaction error: Producer fenced by newer instance: "
                 "Failed to end transaction: Broker: There is a newer producer with the same "
                 "transactionalId which fences the current one (_FENCED)")
FENCED_FATAL = ("[thrd:main]: Fatal error: Local: This instance has been fenced by a newer "
                "instance: Producer fenced by newer instance: Failed to end transaction: "
                "Broker: There is a newer producer with the same transactionalId which fences "
                "the current one")
REBALANCE_TXNERR = ("[thrd:main]: Current transaction failed in state InTransaction: Failed to "
                    "commit offsets to transaction on broker localhost:9092/1: Broker: {text} "
                    "(after 3ms) ({code})")
# A take-over's init_transactions while the coordinator aborts the last owner's
# transaction (seen on the local broker: a second producer of one transactional id).
GETPID_RETRY = ("[thrd:main]: Failed to acquire transactional PID from broker TxnCoordinator/0: "
                "Broker: {text}: retrying")
CONCURRENT = ("Producer attempted to update a transaction while another concurrent operation "
              "on the same transaction was ongoing")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.captureWarnings(False)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fresh folder on a clock the test moves (no background thread)."""
    clock = Clock()
    monkeypatch.setattr(logs, "FOLDER", Folder(clock=clock, background=False))
    return clock


class Output:
    """The JSON lines logging writes. Call it for the lines written since the last call."""

    def __init__(self) -> None:
        self._written = io.StringIO()
        self._handler = logging.StreamHandler()
        self.configure()

    def configure(self, level: str = "INFO") -> None:
        """configure_logging("json", level), writing here."""
        configure_logging("json", level)
        [handler] = logging.getLogger().handlers
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(self._written)
        self._handler = handler

    def __call__(self) -> list[dict[str, object]]:
        with self._handler.lock or contextlib.nullcontext():  # a thread may be writing
            text = self._written.getvalue()
            self._written.seek(0)
            self._written.truncate()
        return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def lines(clock: Clock) -> Output:
    return Output()


def rdkafka(client: str, level: int, facility: str, message: str,
            instance: str = "txstage-admin#producer-1") -> None:
    """What confluent_kafka calls for one librdkafka log line."""
    librdkafka_logger(client).log(level, "%s [%s] %s", facility, instance, message)


def times(line: dict[str, object]) -> int:
    """How many occurrences a printed line stands for: itself, or for a count line
    (``repeated``), the lines it counts."""
    repeated = line.get("repeated", 1)
    assert isinstance(repeated, int)
    return repeated


def test_a_connection_refused_repeated_a_thousand_times_prints_a_handful_of_lines(
        clock: Clock, lines: Output) -> None:
    # What `txstage run` against a closed port did: ~20 lines a second from the admin
    # client, renewed (a new instance number) between start-up attempts.
    for i in range(1000):
        clock.now = 1000 + i / 10
        rdkafka("admin", logging.ERROR, "FAIL",
                REFUSED.format(ms=i % 5, suppressed=", 3 identical error(s) suppressed" * (i % 2)),
                instance=f"txstage-admin#producer-{3 + i // 400}")
    logs.FOLDER.flush(everything=True)
    printed = lines()
    assert len(printed) <= 5, printed
    assert sum(times(line) for line in printed) == 1000
    assert {line["level"] for line in printed} == {"warning"}
    assert "Connection refused" in str(printed[0]["event"])
    assert "repeated" not in printed[0]
    assert "repeated 299 times in the last 30 s" in str(printed[1]["event"])


def test_connection_refused_through_error_cb_is_folded_across_clients(
        clock: Clock, lines: Output) -> None:
    reason = REFUSED.format(ms=0, suppressed="").split("]: ", 1)[1]
    callbacks = [error_cb(f"g.numbers.{p}") for p in range(12)]
    for second in range(10):
        clock.now = 1000 + second
        for on_error in callbacks:
            on_error(KafkaError(KafkaError._TRANSPORT, reason))
            on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    first = lines()
    assert [(line["event"], line["code"]) for line in first] == [
        ("kafka_client_error", "_TRANSPORT"), ("kafka_client_error", "_ALL_BROKERS_DOWN")]
    clock.now += 30
    logs.FOLDER.flush()
    counts = {line["code"]: line["repeated"] for line in lines()}
    assert counts == {"_TRANSPORT": 119, "_ALL_BROKERS_DOWN": 119}


def test_a_fence_is_a_warning_not_critical(lines: Output) -> None:
    rdkafka("producer", logging.CRITICAL, "TXNERR", FENCED_TXNERR)  # LOG_ALERT
    rdkafka("producer", logging.CRITICAL, "FATAL", FENCED_FATAL)  # LOG_EMERG
    error_cb("g.numbers.3")(KafkaError(KafkaError._FENCED, FENCED_FATAL.split("]: ")[1],
                                       fatal=True))
    printed = lines()
    assert [line["level"] for line in printed] == ["warning"] * 3
    assert printed[2]["code"] == "_FENCED" and printed[2]["fatal"] is True


@pytest.mark.parametrize(("code", "text"), [
    ("ILLEGAL_GENERATION", "Specified group generation id is not valid"),
    ("REBALANCE_IN_PROGRESS", "The group is rebalancing, so a rejoin is needed"),
    ("UNKNOWN_MEMBER_ID", "The coordinator is not aware of this member"),
])
def test_a_rebalance_txnerr_is_info(lines: Output, code: str, text: str) -> None:
    rdkafka("producer", logging.ERROR, "TXNERR", REBALANCE_TXNERR.format(code=code, text=text))
    [line] = lines()
    assert line["level"] == "info"
    assert code in str(line["event"])


def test_a_rebalance_txnerr_is_not_printed_at_warning_level(lines: Output) -> None:
    lines.configure("WARNING")
    rdkafka("producer", logging.ERROR, "TXNERR",
            REBALANCE_TXNERR.format(code="ILLEGAL_GENERATION", text="generation not valid"))
    assert lines() == []


def test_only_the_expected_lines_are_lowered_real_errors_stay_errors(lines: Output) -> None:
    cases = [  # (level from librdkafka, facility, message, level logged)
        (logging.ERROR, "FAIL", REFUSED.format(ms=0, suppressed=""), "warning"),
        (logging.ERROR, "ERROR", "[thrd:app]: rdkafka#producer-1: 1/1 brokers are down",
         "warning"),
        (logging.INFO, "FAIL", "[thrd:b1]: b1:9092/1: Disconnected (after 61234ms in state UP)",
         "info"),  # never raised
        (logging.ERROR, "FAIL", "[thrd:sasl_ssl://b1:9093/bootstrap]: b1:9093/bootstrap: SASL "
         "authentication error: Authentication failed during authentication due to invalid "
         "credentials with SASL mechanism SCRAM-SHA-512 (after 5ms in state AUTH_REQ)", "error"),
        (logging.ERROR, "FAIL", "[thrd:b1:9093/bootstrap]: b1:9093/bootstrap: Disconnected while "
         "requesting ApiVersion: might be caused by incorrect security.protocol configuration "
         "(connecting to a SSL listener?) or broker version is < 0.10 (see api.version.request) "
         "(after 3ms in state APIVERSION_QUERY)", "error"),
        (logging.ERROR, "TXNERR", "[thrd:main]: Current transaction failed in state "
         "BeginCommit: 12 message(s) failed delivery (MSG_TIMED_OUT)", "error"),
        (logging.CRITICAL, "FATAL", "[thrd:main]: Fatal error: Broker: Transactional Id "
         "authorization failed: Failed to acquire transactional PID", "critical"),
        (logging.CRITICAL, "TXNERR", "[thrd:main]: Fatal transaction error: Failed to acquire "
         "transactional PID: Broker: Transactional Id authorization failed "
         "(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)", "critical"),
        (logging.ERROR, "REQTMOUT", "[thrd:b1:9092/1]: b1:9092/1: Timed out 1 in-flight, 0 "
         "retry-queued, 0 out-queue, 0 partially-sent requests", "error"),
    ]
    for level, facility, message, _ in cases:
        rdkafka("producer", level, facility, message)
    assert [line["level"] for line in lines()] == [expected for *_, expected in cases]


def test_a_lost_connection_that_was_up_is_logged_each_time_failed_attempts_are_folded(
        lines: Output) -> None:
    for age_ms in (523, 1780, 2304):  # each a connection that was up, then lost
        rdkafka("producer", logging.WARNING, "FAIL",
                f"[thrd:b1:9092/1]: b1:9092/1: Disconnected (after {age_ms}ms in state UP)")
    for ms in (0, 1, 4):
        rdkafka("producer", logging.ERROR, "FAIL", REFUSED.format(ms=ms, suppressed=""))
    events = [str(line["event"]) for line in lines()]
    assert [e for e in events if "Disconnected" in e] == [
        f"FAIL [txstage-admin#producer-1] [thrd:b1:9092/1]: b1:9092/1: Disconnected (after "
        f"{age_ms}ms in state UP)" for age_ms in (523, 1780, 2304)]
    assert len([e for e in events if "Connection refused" in e]) == 1


def test_folding_is_off_at_debug_level_and_on_otherwise(lines: Output) -> None:
    for _ in range(10):
        rdkafka("consumer", logging.ERROR, "FAIL", REFUSED.format(ms=0, suppressed=""))
    assert len(lines()) == 1
    lines.configure("DEBUG")
    for _ in range(10):
        rdkafka("consumer", logging.ERROR, "FAIL", REFUSED.format(ms=0, suppressed=""))
    assert len(lines()) == 10


def test_folding_never_raises_from_a_librdkafka_thread(
        monkeypatch: pytest.MonkeyPatch, clock: Clock, lines: Output) -> None:
    # librdkafka lines arrive on whichever thread polls a client: many at once. Not a
    # line may be lost or counted twice, and nothing may raise into confluent_kafka.
    errors: list[BaseException] = []

    def storm(client: str) -> None:
        try:
            for i in range(500):
                rdkafka("producer", logging.ERROR, "FAIL", REFUSED.format(ms=i % 3, suppressed=""),
                        instance=f"txstage-g#producer-{client}")
                error_cb(client)(KafkaError(KafkaError._TRANSPORT, "b1:9092/1: Connection refused"))
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=storm, args=(str(n),)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logs.FOLDER.flush(everything=True)
    printed = lines()
    assert errors == []
    assert len(printed) == 4  # one line and one count, for each of the two kinds
    assert sum(times(line) for line in printed) == 2 * 8 * 500

    def broken() -> float:
        raise RuntimeError("clock gone")

    monkeypatch.setattr(logs, "FOLDER", Folder(clock=broken, background=False))
    thread = threading.Thread(target=storm, args=("9",))
    thread.start()
    thread.join()
    assert errors == []
    assert len(lines()) == 2 * 500  # the folder failed: every line printed, none lost


def test_the_count_is_logged_when_the_window_ends_even_if_nothing_else_is_logged(
        monkeypatch: pytest.MonkeyPatch, lines: Output) -> None:
    monkeypatch.setattr(logs, "FOLDER", Folder(window_s=0.3))  # real clock, its own thread
    for _ in range(5):
        rdkafka("admin", logging.ERROR, "FAIL", REFUSED.format(ms=0, suppressed=""))
    printed = lines()
    deadline = time.monotonic() + 5
    while len(printed) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        printed += lines()
    assert [line.get("repeated") for line in printed] == [None, 4]


@pytest.mark.parametrize(("text", "level"), [
    (CONCURRENT, "info"),
    ("Coordinator load in progress", "info"),
    ("Not coordinator", "info"),
    ("Coordinator not available", "info"),
    ("Transactional Id authorization failed", "warning"),  # not the take-over's
])
def test_a_take_overs_producer_id_retry_is_info(lines: Output, text: str, level: str) -> None:
    rdkafka("producer", logging.WARNING, "GETPID", GETPID_RETRY.format(text=text))
    [line] = lines()
    assert line["level"] == level, line
