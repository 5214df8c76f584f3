"""Replicas of the stage as real OS processes (``python -m service run``), and the
waiting and input helpers the stage tests share."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import ClassVar

from confluent_kafka import KafkaException, Producer
from prometheus_client.parser import text_string_to_metric_families

from service.tools.verify import committed_offsets, end_offsets
from tests.harness.kafka import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]


def stage_tree() -> Path:
    """The source tree replicas run from (their cwd, so ``service`` and the test
    transforms are imported from it): this repo, or ``$TXSTAGE_TEST_STAGE_TREE`` to run
    another version of the stage under the same tests, e.g. to show that a regression
    test fails on the code before a fix. That tree needs ``tests/integration/
    transforms.py`` with the transforms the tests name."""
    override = os.environ.get("TXSTAGE_TEST_STAGE_TREE")
    return Path(override).resolve() if override else REPO_ROOT


class Replica:
    """One stage process; its log is JSON lines in ``log_path``. Every replica started
    is in ``Replica.started`` until ``kill_leftovers`` (after each test) ends it."""

    started: ClassVar[list[Replica]] = []

    @classmethod
    def kill_leftovers(cls) -> list[str]:
        """SIGKILL every replica still running; the names of those that were."""
        running = [replica for replica in cls.started if replica.alive()]
        for replica in running:
            replica.kill()
        cls.started.clear()
        return [replica.name for replica in running]

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.port = free_ports(1)[0]
        self.env = {**os.environ, **env, "TXSTAGE_METRICS_PORT": str(self.port),
                    "TXSTAGE_METRICS_HOST": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service", "run"], cwd=stage_tree(), env=self.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        Replica.started.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM and wait: the exit code."""
        self.signal(signal.SIGTERM)
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.alive():
            self.signal(signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(10)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def ready(self) -> bool:
        try:
            return self.get("/readyz")[0] == 200
        except OSError:
            return False

    def metrics(self) -> str:
        return self.get("/metrics")[1]

    def log_lines(self) -> list[dict[str, object]]:
        lines = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                lines.append({"event": "<not json>", "raw": raw})
        return lines

    def events(self, name: str) -> list[dict[str, object]]:
        return [line for line in self.log_lines() if line.get("event") == name]

    def diagnosis(self, lines: int = 40) -> str:
        """The log without connection noise: why the stage failed if it did, its last
        ``lines`` lines, then the last thread dump and partition states (SIGUSR1) if
        there were any."""
        text = self.log_path.read_text(errors="replace").splitlines()
        noise = ("kafka.client_error", "Connect to ipv4", "brokers are down")
        quiet = [line for line in text if not any(n in line for n in noise)]
        dump_at = max((i for i, line in enumerate(text)
                       if line.startswith(("Thread 0x", "Current thread 0x"))), default=None)
        parts = quiet[-lines:]
        failed = [line for line in text if '"event": "stage.failed"' in line]
        if failed:  # first: a long tail is often cut in the middle where it is shown
            parts = ["--- why it failed", *failed, "--- the log's end", *parts]
        if dump_at is not None:
            start = dump_at
            while start > 0 and (not text[start - 1] or text[start - 1].startswith(
                    ("Thread 0x", "Current thread", "  File "))):
                start -= 1
            parts += ["--- thread stacks (SIGUSR1)", *text[start:dump_at + 200]]
        return "\n".join(parts)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def samples(replica: Replica) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, parsed by Prometheus' own text parser ({} if unreachable)."""
    parsed = {}
    try:
        text = replica.metrics()
    except OSError:
        return {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            parsed[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return parsed


def value(replica: Replica, name: str, **labels: str) -> float:
    return samples(replica).get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(condition: Callable[[], bool], timeout: float, what: str,
              on_timeout: Callable[[], str] = lambda: "") -> float:
    """Poll ``condition`` until true; fail with ``what`` after ``timeout`` seconds."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{on_timeout()}")
        time.sleep(0.2)
    return time.monotonic() - started


def all_committed(bootstrap: str, group: str, topics: list[str]) -> bool:
    """True once the group's committed offsets reach the end offsets; False while
    the cluster cannot say (a broker down): callers poll."""
    try:
        ends = end_offsets(bootstrap, topics)
        committed = committed_offsets(bootstrap, group, topics)
    except KafkaException:
        return False
    # An empty partition has nothing to commit (and no committed offset): it is done.
    return all(end == 0 or committed.get(key, -1) >= end for key, end in ends.items())


def paced(values: Iterable[int], per_second: float) -> Iterator[int]:
    """``values`` no faster than ``per_second``: input that keeps arriving for a while."""
    started = time.monotonic()
    for n, v in enumerate(values):
        ahead = n / per_second - (time.monotonic() - started)
        if ahead > 0.05:
            time.sleep(ahead)
        yield v


def produce_inputs(bootstrap: str, topic: str, values: Iterable[int], partitions: int,
                   *, value: Callable[[int], bytes] = lambda i: str(i).encode()) -> int:
    """Write ``str(i)`` for each i, key ``k<i>``, round-robin over ``partitions``."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    count = 0
    for i in values:
        while True:
            try:
                producer.produce(topic, value(i), f"k{i}".encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
    assert producer.flush(30) == 0, "inputs not delivered"
    return count
