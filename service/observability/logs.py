"""Logging: one structlog pipeline for our logs, the stdlib's and librdkafka's.

Every line carries ``timestamp`` (ISO 8601, UTC), ``level``, ``logger`` and
``event``, plus whatever is bound with ``structlog.contextvars`` (for example
``partition`` and ``transactional_id`` while a commit runs). In ``json`` format
each line on stdout is one JSON object, ready for a log shipper; ``console`` is
for people at a terminal.

Records from the stdlib ``logging`` module (other libraries, librdkafka through
:func:`librdkafka_logger`) go through the same processors, so a deployment never
has to parse two formats.

librdkafka's lines and ``error_cb``'s errors get two more things here. Their level
comes from :data:`LEVELS` (a rebalance or a fence is the system working, not an
error), and :data:`FOLDER` folds repeats: a client that cannot reach its cluster
says so dozens of times a second, and the first line, then a count every
:data:`FOLD_WINDOW_S`, say the same. ``TXSTAGE_LOG_LEVEL=DEBUG`` turns folding off.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import structlog
from confluent_kafka import KafkaError
from structlog.types import Processor

LogFormat = Literal["json", "console"]

LIBRDKAFKA_LOGGER = "txstage.librdkafka"
"""Parent of the stdlib loggers handed to librdkafka, one child per client."""

_KAFKA_LOG = "txstage.kafka"


def configure_logging(fmt: LogFormat, level: str = "INFO") -> None:
    """Configure structlog and the stdlib root logger to write ``fmt`` lines to stdout.

    Idempotent: calling it again replaces the previous configuration (handlers
    included) instead of adding a second output.
    """
    shared = _shared_processors()
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: a cached logger keeps the configuration it first saw, which
        # would break reconfiguration and structlog.testing.capture_logs(). Nothing
        # logs per record, so the few microseconds per call do not matter.
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_render(fmt)],
    ))
    _install_root_handler(handler, level)
    # At DEBUG one wants every line, repeats included.
    FOLDER.enabled = logging.getLogger().level > logging.DEBUG


def _shared_processors() -> list[Processor]:
    """What every line gets, whether it was logged through structlog or the stdlib."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def _render(fmt: LogFormat) -> list[Processor]:
    """The tail of the chain: exceptions become a string field in JSON, pretty on a console."""
    if fmt == "json":
        return [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    if fmt == "console":
        return [structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty())]
    raise ValueError(f"log format must be 'json' or 'console', got {fmt!r}")


def _install_root_handler(handler: logging.Handler, level: str) -> None:
    """Make ``handler`` the root logger's only handler: the process has one log output."""
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)


def librdkafka_logger(client: str) -> logging.Logger:
    """The stdlib logger to pass as a client's ``logger`` config key.

    confluent_kafka then forwards librdkafka's own log lines to it (as
    ``"<FACILITY> [<client name>] <message>"``) instead of printing them to
    stderr; the root handler set up by :func:`configure_logging` renders them
    like every other line, with ``logger`` = ``txstage.librdkafka.<client>``.
    On the way each line gets its level from :data:`LEVELS` and repeats are
    folded (:class:`Folder`).
    """
    logger = logging.getLogger(f"{LIBRDKAFKA_LOGGER}.{client}")
    with _ATTACHING:  # twice on one logger would fold every line as its own repeat
        if _LINES not in logger.filters:
            logger.addFilter(_LINES)
    return logger


def error_cb(client: str) -> Callable[[KafkaError], None]:
    """An ``error_cb`` for a client's config that logs the error and nothing else.

    librdkafka reports most of these (brokers down, transport failures) while it
    recovers by itself; the errors that matter to a transaction also come back
    from the transactional call, where they are classified. A callback that
    raised would surface from whatever poll/consume/flush call happened to
    serve it, disguised as that call's error, so this one never raises.

    ``kafka_client_error`` is a warning, an error when fatal, unless :data:`LEVELS`
    says otherwise (a fence is a warning); repeats are folded like librdkafka's
    lines, whichever client they come from, the count in a ``repeated`` field.
    """
    log = structlog.get_logger(_KAFKA_LOG)

    def on_error(err: KafkaError) -> None:
        try:
            fields = _describe(err)
            code, reason = str(fields["code"]), str(fields["reason"])
            level = _level_of(code, reason, logging.ERROR if fields["fatal"] else logging.WARNING)

            def again(times: int, window_s: float) -> None:
                log.log(level, "kafka_client_error", client=client, **fields,
                        repeated=times, window_s=window_s)

            if FOLDER.admit((_KAFKA_LOG, level, code, _normalised(reason)), again):
                log.log(level, "kafka_client_error", client=client, **fields)
        except Exception:  # a logging failure must not become a Kafka error
            _last_resort(client, err)

    return on_error


def _describe(err: KafkaError) -> dict[str, object]:
    return {
        "code": err.name(),
        "reason": err.str(),
        "fatal": err.fatal(),
        "retriable": err.retriable(),
    }


def _last_resort(client: str, err: object) -> None:
    """Write something, anything, when logging the error itself failed."""
    with contextlib.suppress(Exception):  # nothing is left to report to
        sys.stderr.write(f"txstage: kafka client {client} error: {err!r}\n")


# ------------------------------------------------------------------ levels


@dataclass(frozen=True)
class Level:
    """One row of :data:`LEVELS`: a line from one of ``sources`` (librdkafka log
    facilities, or ``error_cb`` error codes) whose message matches ``pattern``
    (``None``: any) is logged at ``at_most``, or lower if librdkafka said lower."""

    sources: frozenset[str]
    pattern: re.Pattern[str] | None
    at_most: int
    why: str


_FENCE = re.compile(r"\(_FENCED\)|PRODUCER_FENCED|INVALID_PRODUCER_EPOCH"
                    r"|fenced by (?:a )?newer instance")
_REBALANCE = re.compile(r"ILLEGAL_GENERATION|REBALANCE_IN_PROGRESS|UNKNOWN_MEMBER_ID")
# A plain "Disconnected (after ...)" only: "Disconnected while requesting ApiVersion"
# and "Disconnected: verify that security.protocol ..." name a configuration error.
_UNREACHABLE = re.compile(r"Connection refused|Connect to \S+ failed|Disconnected \(|"
                          r"Connection reset by peer|Failed to resolve|\d+/\d+ brokers are down")
# "Failed to acquire transactional PID ...: retrying" (librdkafka's rdkafka_idempotence.c)
# for what a busy coordinator answers: CONCURRENT_TRANSACTIONS while it aborts what the
# last owner left open, or it is loading or moving. Any other error stays a warning.
_COORDINATOR_BUSY = re.compile(
    r"Failed to acquire transactional PID .*(?:concurrent operation on the same transaction"
    r"|Coordinator load in progress|Not coordinator|Coordinator not available).*: retrying")

LEVELS: tuple[Level, ...] = (
    Level(frozenset({"TXNERR", "FATAL"}), _FENCE, logging.WARNING,
          "a newer owner of the transactional id fenced this producer: a rebalance or a "
          "replaced replica; the stage drops the producer (producer.fenced) and goes on"),
    Level(frozenset({"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"}), None,
          logging.WARNING, "the same fence, as error_cb reports it"),
    Level(frozenset({"TXNERR"}), _REBALANCE, logging.INFO,
          "the group rebalanced while a transaction held offsets of the old generation; "
          "the stage aborts it and carries on (transaction.aborted)"),
    Level(frozenset({"GETPID"}), _COORDINATOR_BUSY, logging.INFO,
          "a take-over's init_transactions met the coordinator still ending the last "
          "owner's transaction (or moving); librdkafka asks again by itself"),
    Level(frozenset({"FAIL", "ERROR", "_TRANSPORT", "_ALL_BROKERS_DOWN"}), _UNREACHABLE,
          logging.WARNING, "a broker cannot be reached; librdkafka retries by itself, and "
          "the stage fails on its own (stage.failed) when that matters"),
)
"""How loud librdkafka's lines and error_cb's errors are: the first row that matches
decides; a line no row matches keeps librdkafka's level (LOG_ERR is ``error``,
LOG_CRIT and above ``critical``) or error_cb's (``error`` when fatal, else ``warning``)."""


def _level_of(source: str, message: str, level: int) -> int:
    for row in LEVELS:
        if source in row.sources and (row.pattern is None or row.pattern.search(message)):
            return min(level, row.at_most)
    return level


# ------------------------------------------------------------------ folding

FOLD_WINDOW_S = 30.0
"""How long identical lines are folded before their count is logged."""

_VOLATILE: tuple[tuple[re.Pattern[str], str], ...] = (
    # The client instance ("rdkafka#producer-12"): each retry or partition has its own.
    (re.compile(r"#(producer|consumer)-\d+"), r"#\1"),
    # How long a failed attempt took. A lost connection that was up keeps its age:
    # each such loss is an event of its own.
    (re.compile(r"after \d+ms(?! in state UP)"), "after Nms"),
    # librdkafka's own fold count.
    (re.compile(r", \d+ identical error\(s\) suppressed"), ""),
)


def _normalised(message: str) -> str:
    """``message`` without the parts that differ between repeats of one line."""
    for pattern, replacement in _VOLATILE:
        message = pattern.sub(replacement, message)
    return message


Again = Callable[[int, float], None]
"""Logs the line a window folded again, with the count: ``(times, window_s)``."""


@dataclass
class _Window:
    opened: float
    again: Again
    folded: int = 0


class Folder:
    """Folds repeated identical lines, thread-safely; never raises.

    The first line of a kind (its key: logger, level, source and normalised message)
    is printed and opens a window of ``window_s``; identical lines within it are only
    counted. When the window ends with a count, the line is logged once more with it
    (``repeated``) and a new window opens; a window that folded nothing just closes.
    A background thread ends windows on time even when nothing else is logged.
    """

    def __init__(self, window_s: float = FOLD_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, background: bool = True) -> None:
        self.window_s = window_s
        self.enabled = True
        self._clock = clock
        self._background = background
        self._windows: dict[Hashable, _Window] = {}
        self._changed = threading.Condition(threading.Lock())
        self._flusher: threading.Thread | None = None

    def admit(self, key: Hashable, again: Again) -> bool:
        """Whether to log this line now (``False``: it was counted). ``again`` logs it
        with its count when its window ends; the latest line's is kept."""
        try:
            if not self.enabled:
                return True
            with self._changed:
                now = self._clock()
                due = self._due(now)
                window = self._windows.get(key)
                if window is None:
                    self._windows[key] = _Window(now, again)
                else:
                    window.folded += 1
                    window.again = again
                    if window.folded == 1:
                        self._wake()
        except Exception:  # print too much rather than lose a line
            return True
        self._log(due)
        return window is None

    def flush(self, everything: bool = False) -> None:
        """Log the counts of the windows that ended (``everything``: of all windows, at
        exit, and forget them)."""
        try:
            with self._changed:
                due = self._due(self._clock(), everything)
        except Exception:  # nothing to report it to
            return
        self._log(due)

    def _due(self, now: float, everything: bool = False) -> list[tuple[Again, int]]:
        due = []
        for key, window in list(self._windows.items()):
            if not everything and now - window.opened < self.window_s:
                continue
            if window.folded:
                due.append((window.again, window.folded))
            if window.folded and not everything:
                window.opened, window.folded = now, 0
            else:
                del self._windows[key]
        return due

    def _log(self, due: list[tuple[Again, int]]) -> None:
        """Outside the lock: logging may take the handler's lock, or block on stdout."""
        for again, times in due:
            with contextlib.suppress(Exception):
                again(times, self.window_s)

    def _wake(self) -> None:
        """A window started folding: have the background thread end it on time."""
        if not self._background:
            return
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_on_time, daemon=True,
                                             name="txstage-log-folding")
            self._flusher.start()
        self._changed.notify()

    def _flush_on_time(self) -> None:
        while True:
            try:
                with self._changed:
                    ends = [w.opened + self.window_s for w in self._windows.values()
                            if w.folded]
                    self._changed.wait(max(0.1, min(ends) - self._clock()) if ends else None)
                self.flush()
            except Exception:  # neither die nor spin
                time.sleep(self.window_s)


FOLDER = Folder()
"""The process's folder, shared by every librdkafka logger and error_cb."""

_CONFLUENT_FORMAT = "%s [%s] %s"  # confluent_kafka's: facility, client instance, message


class _LibrdkafkaLines(logging.Filter):
    """On each librdkafka logger: sets a line's level from :data:`LEVELS` and folds
    repeats. It runs on whichever thread serves the client's log queue; it must never
    raise, so a line it cannot handle passes as it came."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return _relevel_and_fold(record)
        except Exception:
            return True


def _relevel_and_fold(line: logging.LogRecord) -> bool:
    args = line.args
    if line.msg == _CONFLUENT_FORMAT and isinstance(args, tuple) and len(args) == 3:
        facility, message = str(args[0]), str(args[2])
    else:
        facility, message = "", line.getMessage()
    level = _level_of(facility, message, line.levelno)
    if level != line.levelno:
        if not logging.getLogger(line.name).isEnabledFor(level):
            return False
        line.levelno, line.levelname = level, logging.getLevelName(level)
    return FOLDER.admit((line.name, level, facility, _normalised(message)),
                        partial(_log_again, line))


def _log_again(line: logging.LogRecord, times: int, window_s: float) -> None:
    logger = logging.getLogger(line.name)
    if logger.isEnabledFor(line.levelno):
        logger.callHandlers(logger.makeRecord(
            line.name, line.levelno, line.pathname, line.lineno,
            "%s (repeated %d times in the last %d s)", (line.getMessage(), times, window_s),
            None, extra={"repeated": times, "window_s": window_s}))


_LINES = _LibrdkafkaLines()
_ATTACHING = threading.Lock()
