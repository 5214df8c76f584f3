"""Kafka's own ``kafka-consumer-groups.sh`` (its class, on the classpath of the Kafka the
project installs: the script is ``kafka-run-class.sh`` with this class), and a transactional
producer for input that carries commit markers."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Producer

from service.local_kafka.jars import install

CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


@dataclass(frozen=True)
class GroupRow:
    """One line of ``--describe``: offsets as the tool prints them (None: "-")."""

    current: int | None
    end: int
    lag: int | None
    consumer: str


def kafka_consumer_groups(*args: str, timeout_s: float = 60) -> str:
    """``kafka-consumer-groups.sh <args>``: its standard output (fails on a non-zero exit)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    assert java, "java not found"
    result = subprocess.run([java, "-cp", str(install() / "*"), CONSUMER_GROUPS, *args],
                            capture_output=True, text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def describe(bootstrap: str, group: str) -> dict[tuple[str, int], GroupRow]:
    """``--describe --group``: each partition's committed offset, log end and LAG."""
    out = kafka_consumer_groups("--bootstrap-server", bootstrap, "--describe", "--group", group)
    rows: dict[tuple[str, int], GroupRow] = {}
    header: list[str] | None = None
    for line in out.splitlines():
        fields = line.split()
        if fields[:2] == ["GROUP", "TOPIC"]:
            header = fields
            continue
        if header is None or len(fields) < 6:
            continue
        row = dict(zip(header, fields, strict=False))
        rows[(row["TOPIC"], int(row["PARTITION"]))] = GroupRow(
            _number(row["CURRENT-OFFSET"]), int(row["LOG-END-OFFSET"]), _number(row["LAG"]),
            row.get("CONSUMER-ID", "-"))
    return rows


def _number(text: str) -> int | None:
    return None if text == "-" else int(text)


def produce_transactional(bootstrap: str, topic: str, values: Iterable[int], partitions: int,
                          transactional_id: str, *, per_transaction: int = 100) -> int:
    """Write ``str(i)`` (key ``k<i>``, round-robin over ``partitions``) in transactions
    of ``per_transaction`` records: each commit leaves a marker on every partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "linger.ms": 5})
    producer.init_transactions(30)
    count = 0
    for i in values:
        if count % per_transaction == 0:
            if count:
                producer.commit_transaction(30)
            producer.begin_transaction()
        producer.produce(topic, str(i).encode(), f"k{i}".encode(), partition=i % partitions)
        count += 1
    if count:
        producer.commit_transaction(30)
    return count
