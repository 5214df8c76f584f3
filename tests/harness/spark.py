"""Fixtures of the backfill tests: a real local SparkSession, and a backfill runner.

Import them into a test module (``from tests.harness.spark import
backfill_fixture, spark_fixture``); pytest knows them as ``spark`` and ``backfill``.

The session starts once per test run and is ``local[2,4]``: two cores like the target
box, and up to four attempts per task, because plain ``local[2]`` never retries a failed
task and the retry is what the fault tests exercise. No Spark Kafka connector is on the
classpath: the backfill's tasks read and write Kafka with librdkafka. Python
workers run this interpreter from the repository root, so
``tests.harness.backfill_faults`` imports in them as it does here.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from service.backfill import main
from tests.harness.kafka import KafkaService

REPO_ROOT = Path(__file__).resolve().parents[2]
MASTER = "local[2,4]"


@functools.cache
def _session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Workers start in the JVM's working directory: make the repository importable
    # wherever pytest was started from.
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    session = (SparkSession.builder.master(MASTER).appName("txstage-backfill-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.default.parallelism", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(name="spark", scope="session")
def spark_fixture() -> Iterator[SparkSession]:
    """Fails (never skips) when Spark cannot start."""
    try:
        session = _session()
    except Exception as exc:
        pytest.fail(f"could not start a local SparkSession: {exc}", pytrace=False)
    yield session


@dataclass
class Backfill:
    """Runs ``txstage backfill`` in this process, on the test session's Spark."""

    bootstrap: str
    capsys: pytest.CaptureFixture[str]

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        """Exit code, stdout, stderr."""
        quiet = () if argv and argv[0] == "verify" else ("--progress-interval", "0")
        code = main([*argv, *quiet])
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err

    @staticmethod
    def job_id(printed: str) -> str:
        return printed.split("backfill job ", 1)[1].split(maxsplit=1)[0]


@pytest.fixture(name="backfill")
def backfill_fixture(kafka: KafkaService, spark: SparkSession, monkeypatch: pytest.MonkeyPatch,
                     unique_name: Callable[[str], str], capsys: pytest.CaptureFixture[str],
                     tmp_path: Path) -> Iterator[Backfill]:
    """TXSTAGE_* set for the session broker and square; a transactional-id prefix (and so
    a progress topic) of the test's own; no stray .env."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TXSTAGE_BOOTSTRAP_SERVERS", kafka.bootstrap)
    monkeypatch.setenv("TXSTAGE_TRANSFORM", "service.examples.square:square")
    monkeypatch.setenv("TXSTAGE_TRANSACTIONAL_ID_PREFIX", unique_name("bf"))
    for name in ("TXSTAGE_OUTPUT_TOPIC", "TXSTAGE_DLQ_TOPIC", "TXSTAGE_GROUP_ID"):
        monkeypatch.delenv(name, raising=False)
    yield Backfill(kafka.bootstrap, capsys)
