"""Replicas of the stage as real OS processes (``python -m service run``, the
``Replica`` of :mod:`tests.harness.replica`, re-exported here), and the waiting and
input helpers the stage tests share."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType
from prometheus_client.parser import text_string_to_metric_families

# REPO_ROOT, Replica and stage_tree are re-exported, as the tests import them from
# here (the aliases say so to mypy).
from bench.replica import REPO_ROOT as REPO_ROOT  # noqa: PLC0414
from service.contract.records import Transform
from service.examples.square import square
from service.tools.verify import Report, committed_offsets, end_offsets, verify
from tests.harness.admin import create_topic
from tests.harness.replica import Replica as Replica  # noqa: PLC0414
from tests.harness.replica import stage_tree as stage_tree  # noqa: PLC0414


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
                   *, value: Callable[[int], bytes] = lambda i: str(i).encode(),
                   max_bytes: int = 1_000_000) -> int:
    """Write ``str(i)`` for each i, key ``k<i>``, round-robin over ``partitions``
    (``max_bytes``: the producer's message.max.bytes, librdkafka's default unless said)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "message.max.bytes": max_bytes})
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


PARTITIONS = 8
# Both consumer group protocols: "classic" (JoinGroup/SyncGroup, the session time-out
# is the client's) and "consumer" (KIP-848: the broker assigns, and the session
# time-out is the broker's group.consumer.session.timeout.ms or the group's config).
GROUP_PROTOCOLS = ("classic", "consumer")


def one_protocol(protocol: str, fixture: str = "stage") -> pytest.MarkDecorator:
    """Run a test under one group protocol instead of both: for a test whose fault is
    on the producer's or the broker's side, where the group protocol changes nothing
    it checks (the rebalance, fencing and shutdown tests still run under both). Each
    such test names the protocol it runs, so both stay covered; it keeps make test
    within its time."""
    assert protocol in GROUP_PROTOCOLS, protocol
    return pytest.mark.parametrize(fixture, [protocol], indirect=True)


def long_transactions(delay_ms: int, commit_interval_ms: int) -> dict[str, str]:
    """Settings of a replica whose transactions stay open long enough for a fault
    (kill, pause) to land inside one."""
    return {"TXSTAGE_TRANSFORM": "tests.harness.transforms:slow_square",
            "TEST_DELAY_MS": str(delay_ms), "TXSTAGE_COMMIT_INTERVAL_MS": str(commit_interval_ms),
            "TXSTAGE_COMMIT_MAX_RECORDS": "1000000"}


@dataclass
class StageSetup:
    """Topics, group and settings of one stage under test."""

    bootstrap: str
    input_topic: str
    output_topic: str
    dlq_topic: str
    group_id: str
    log_dir: Path
    group_protocol: str = "classic"
    env: dict[str, str] = field(default_factory=dict)
    started: list[Replica] = field(default_factory=list)

    def session_timeout_env(self, session_ms: int, heartbeat_ms: int = 500) -> dict[str, str]:
        """What gives this stage's consumers a ``session_ms`` session time-out.

        classic: the client's session.timeout.ms / heartbeat.interval.ms (returned as
        settings to pass to ``replica()``). consumer: librdkafka rejects both with
        group.protocol=consumer; the session is the broker's, so this sets the group's
        own ``consumer.session.timeout.ms`` / ``consumer.heartbeat.interval.ms``
        (KIP-848 group configs) and returns no settings.
        """
        if self.group_protocol == "classic":
            return {"TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS": str(session_ms),
                    "TXSTAGE_CONSUMER__HEARTBEAT_INTERVAL_MS": str(heartbeat_ms)}
        resource = ConfigResource(ResourceType.GROUP, self.group_id, incremental_configs=[
            ConfigEntry("consumer.session.timeout.ms", str(session_ms),
                        incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("consumer.heartbeat.interval.ms", str(heartbeat_ms),
                        incremental_operation=AlterConfigOpType.SET)])
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)
        return {}

    def replica(self, name: str, **overrides: str) -> Replica:
        """Start one more replica; ``overrides`` are extra TXSTAGE_*/TEST_* variables."""
        replica = Replica(name, {**self.env, **overrides}, self.log_dir).start()
        self.started.append(replica)
        return replica

    def verify(self, transform: Transform = square, *, extra_outputs: tuple[str, ...] = (),
               timeout_s: float = 60) -> Report:
        return verify(self.bootstrap, input_topics=[self.input_topic],
                      output_topics=[self.output_topic, self.dlq_topic, *extra_outputs],
                      group_id=self.group_id, transform=transform,
                      default_topic=self.output_topic, dlq_topic=self.dlq_topic,
                      timeout_s=timeout_s)

    def committed(self) -> bool:
        """The group's committed offsets reached the input's end."""
        return all_committed(self.bootstrap, self.group_id, [self.input_topic])

    def wait_committed(self, timeout: float = 90) -> None:
        wait_for(self.committed, timeout, "the group's committed offsets to reach the input end",
                 self.diagnose)

    def assert_exactly_once(self, transform: Transform = square) -> None:
        """V1-V5 over everything, and something was actually checked."""
        report = self.verify(transform)
        assert report.ok, "\n".join(report.problems()) + "\n" + self.logs()
        assert report.found == report.expected > 0

    def logs(self) -> str:
        return "\n".join(f"--- {r.name} (pid {r.proc.pid if r.proc else '?'})\n{r.log_tail()}"
                         for r in self.started)

    def diagnose(self) -> str:
        """For a test that timed out: ask each live replica (SIGUSR1) for its thread
        stacks and its partitions' states, then show those and the logs without the
        client's connection noise."""
        live = [r for r in self.started if r.alive()]
        for replica in live:
            replica.signal(signal.SIGUSR1)
        time.sleep(2.5 if live else 0)
        return "\n".join(f"--- {r.name} (pid {r.proc.pid if r.proc else '?'}, "
                         f"{'alive' if r.alive() else 'exited'})\n{r.diagnosis()}"
                         for r in self.started)


def build_stage(bootstrap: str, unique_name: Callable[[str], str], log_dir: Path,
                group_protocol: str = "classic") -> StageSetup:
    """Fresh topics (input with 8 partitions, output, DLQ), a group, base settings."""
    setup = StageSetup(
        bootstrap=bootstrap,
        input_topic=create_topic(bootstrap, unique_name("in"), partitions=PARTITIONS),
        output_topic=create_topic(bootstrap, unique_name("out"), partitions=4),
        dlq_topic=create_topic(bootstrap, unique_name("dlq"), partitions=1),
        group_id=unique_name("group"),
        log_dir=log_dir,
        group_protocol=group_protocol,
    )
    setup.env = {
        "TXSTAGE_BOOTSTRAP_SERVERS": bootstrap,
        "TXSTAGE_GROUP_ID": setup.group_id,
        "TXSTAGE_INPUT_TOPICS": setup.input_topic,
        "TXSTAGE_OUTPUT_TOPIC": setup.output_topic,
        "TXSTAGE_DLQ_TOPIC": setup.dlq_topic,
        "TXSTAGE_TRANSFORM": "service.examples.square:square",
        "TXSTAGE_LOG_FORMAT": "json",
    }
    if group_protocol == "classic":
        # Short session so that a killed or paused replica's partitions move in
        # seconds (the test broker allows group.min.session.timeout.ms=1000).
        setup.env |= {"TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS": "6000",
                      "TXSTAGE_CONSUMER__HEARTBEAT_INTERVAL_MS": "500"}
    else:
        # The same 6 s / 500 ms are the test broker's group.consumer.session.timeout.ms
        # and group.consumer.heartbeat.interval.ms: librdkafka refuses both properties
        # with group.protocol=consumer.
        setup.env["TXSTAGE_GROUP_PROTOCOL"] = group_protocol
    return setup


def tear_down(setup: StageSetup) -> None:
    for replica in setup.started:
        replica.kill()
    print(setup.logs())  # pytest shows it when the test failed
