"""Logging: one structlog pipeline for our logs, the stdlib's and librdkafka's.

Every line carries ``timestamp`` (ISO 8601, UTC), ``level``, ``logger`` and
``event``, plus whatever is bound with ``structlog.contextvars`` (for example
``partition`` and ``transactional_id`` while a commit runs). In ``json`` format
each line on stdout is one JSON object, ready for a log shipper; ``console`` is
for people at a terminal.

Records from the stdlib ``logging`` module (other libraries, librdkafka through
:func:`librdkafka_logger`) go through the same processors, so a deployment never
has to parse two formats.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable
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
    """
    return logging.getLogger(f"{LIBRDKAFKA_LOGGER}.{client}")


def error_cb(client: str) -> Callable[[KafkaError], None]:
    """An ``error_cb`` for a client's config that logs the error and nothing else.

    librdkafka reports most of these (brokers down, transport failures) while it
    recovers by itself; the errors that matter to a transaction also come back
    from the transactional call, where they are classified. A callback that
    raised would surface from whatever poll/consume/flush call happened to
    serve it, disguised as that call's error, so this one never raises.
    """
    log = structlog.get_logger(_KAFKA_LOG)

    def on_error(err: KafkaError) -> None:
        try:
            fields = _describe(err)
            severity = logging.ERROR if fields["fatal"] else logging.WARNING
            log.log(severity, "kafka_client_error", client=client, **fields)
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
