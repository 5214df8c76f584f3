"""Issue 12: the backfill on a real Spark cluster, not local mode.

A standalone cluster (a master and two workers, started with PySpark's own
``spark-class``: service/backfill/standalone.py) and a driver of its own (``python -m
service.backfill run --master spark://...`` in a subprocess): the executors are other
JVMs, their Python workers other processes, and no Spark Kafka connector is on any
classpath (the tasks read and write Kafka with librdkafka). The job must write every
input's outputs exactly once, with tasks on both workers, and a second run must write
nothing.

Takes ≈ 38 s (2 cores; make test, 2026-11-28).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from service.backfill.standalone import StandaloneSpark
from service.examples.square import square
from service.tools.verify import verify
from tests.harness.kafka import KafkaService
from tests.harness.reading import end_offsets
from tests.harness.stage import produce_inputs

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

NewTopic = Callable[..., str]
RECORDS = 2_000


def test_a_kafka_backfill_runs_exactly_once_on_a_standalone_spark_cluster(
        kafka: KafkaService, new_topic: NewTopic, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    source = new_topic(partitions=4, prefix="in")
    out, dlq = new_topic(partitions=4, prefix="out"), new_topic(partitions=1, prefix="dlq")
    poison = lambda i: b"not a number" if i % 97 == 0 else str(i).encode()  # noqa: E731
    produce_inputs(kafka.bootstrap, source, range(RECORDS), 4, value=poison)

    with StandaloneSpark(tmp_path / "spark", workers=2, cores=1, memory="1g") as cluster:
        env = {**cluster.env(), "TXSTAGE_BOOTSTRAP_SERVERS": kafka.bootstrap,
               "TXSTAGE_TRANSFORM": "service.examples.square:square",
               "TXSTAGE_TRANSACTIONAL_ID_PREFIX": unique_name("cluster")}
        command = [sys.executable, "-m", "service.backfill", "run",
                   "--source", f"kafka://{source}", "--sink", f"kafka://{out}",
                   "--dlq-topic", dlq, "--slice-records", "250", "--progress-interval", "0",
                   "--master", cluster.master_url,
                   "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1"]

        def backfill() -> str:
            done = subprocess.run(command, check=False, env=env, cwd=tmp_path, capture_output=True,
                                  text=True, timeout=600)
            printed = done.stdout + done.stderr
            assert done.returncode == 0, printed + "\n" + cluster.logs()
            return printed

        printed = backfill()
        assert f"master {cluster.master_url}" in printed, printed
        apps = cluster.state().get("completedapps", [])
        assert len(apps) == 1, apps
        executors = sorted(p.parent.parent.parent.name for p in
                           (tmp_path / "spark").glob("worker*/app-*/*/stderr"))
        assert executors == ["worker0", "worker1"], f"executors ran on {executors}"

        before = end_offsets(kafka.bootstrap, out, isolation="read_uncommitted")
        assert "was already complete: nothing written" in backfill()
        assert end_offsets(kafka.bootstrap, out, isolation="read_uncommitted") == before

    report = verify(kafka.bootstrap, input_topics=[source], output_topics=[out, dlq],
                    group_id=unique_name("nobody"), transform=square, default_topic=out,
                    dlq_topic=dlq)
    report.behind.clear()  # a backfill commits no group offsets
    report.out_of_order.clear()  # slices run in parallel: only a slice keeps input order
    assert report.ok, report.problems()
    assert report.expected == report.found == RECORDS
