"""The SparkSession a backfill runs in: its own, or the one spark-submit (or a test) made.

When txstage starts Spark itself it makes the Python workers use this interpreter. Under
``spark-submit`` the session already exists and its configuration is the operator's.
Spark's Kafka connector is not needed: tasks read and write Kafka with librdkafka
(slice_reader, slice_writer).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from service.errors import ConfigError

log = logging.getLogger("txstage.backfill")

DEFAULT_MASTER = "local[*,4]"  # local mode retries a failed task only with the ",4"
LOG4J2 = Path(__file__).with_name("spark-log4j2.properties")
_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


@contextlib.contextmanager
def spark_session(app_name: str, *, master: str | None,
                  conf: Mapping[str, str] | None = None,
                  kafka_sink: bool = False) -> Iterator[SparkSession]:
    """Yield a session; stop it afterwards only if this call started it. A Kafka sink
    refuses a session that speculates (see check_no_speculation)."""
    active = SparkSession.getActiveSession()
    # spark-submit (and the pyspark shell) start the JVM first and say where it listens;
    # then its master and configuration are the operator's, and --master is ignored.
    started = active is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    if started:
        session = _start(app_name, master or DEFAULT_MASTER, conf or {})
    else:
        session = active or SparkSession.builder.appName(app_name).getOrCreate()
    try:
        if kafka_sink:
            check_no_speculation(session)
        _describe(session)
        yield session
    finally:
        if started:
            session.stop()


def _describe(session: SparkSession) -> None:
    context = session.sparkContext
    log.info("spark %s, master %s, application %s", session.version, context.master,
             context.applicationId)


def _start(app_name: str, master: str, conf: Mapping[str, str]) -> SparkSession:
    # Workers must import this environment's packages (pyarrow, service, the transform).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in driver_log_conf(conf).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("TXSTAGE_SPARK_LOG_LEVEL", "WARN"))
    return session


def driver_log_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with the driver's log4j2 configuration set to txstage's quiet one,
    unless the operator's Java options name one already."""
    options = conf.get(_DRIVER_JAVA_OPTIONS, "")
    if "log4j2.configurationFile" in options:
        return dict(conf)
    ours = f"-Dlog4j2.configurationFile=file:{LOG4J2}"
    return {**conf, _DRIVER_JAVA_OPTIONS: f"{options} {ours}".strip()}


def check_no_speculation(session: SparkSession) -> None:
    """ConfigError when Spark may run a speculative copy of a task (a Kafka sink only).

    Each slice writes under one transactional id, so a speculative copy's
    init_transactions fences the attempt still running: that attempt fails, Spark
    counts the failure toward ``spark.task.maxFailures`` and may start another attempt,
    which fences the copy in turn. A slow slice could so fail the whole job while
    every attempt was healthy. Retries after real failures stay as they are (a retry
    fences a dead or stuck attempt: that is the point). Parquet sinks may speculate:
    Spark's commit protocol keeps one attempt's output."""
    value = session.sparkContext.getConf().get("spark.speculation", "false") or "false"
    if value.strip().lower() == "true":
        raise ConfigError(
            "spark.speculation=true: a speculative copy of a slice's task would fence the "
            "attempt still running (one transactional id per slice), fail it and count "
            "toward spark.task.maxFailures; run Kafka-sink backfills with "
            "--conf spark.speculation=false")
