"""A real local SparkSession for the backfill tests, started once per test run.

Import the ``spark`` fixture into a test module (``from tests.integration.conftest_spark
import spark``). It is ``local[2,4]``: two cores like the target box, and up to four
attempts per task, because plain ``local[2]`` never retries a failed task and the
retry is what the fault tests exercise. The Kafka connector comes from the project's
own cache (service.backfill.jars, resolved with Maven on first use). Python workers
run this interpreter from the repository root, so ``tests.integration.backfill_faults``
imports in them as it does here.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from service.backfill import jars

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
               .config("spark.jars", jars.classpath(jars.ensure_jars()))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.default.parallelism", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """Fails (never skips) when Spark cannot start."""
    try:
        session = _session()
    except Exception as exc:
        pytest.fail(f"could not start a local SparkSession: {exc}", pytrace=False)
    yield session
