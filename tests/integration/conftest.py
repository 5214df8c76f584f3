"""Fixtures for tests that run the stage as real processes against the real broker."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from service.contract.records import Transform
from service.examples.square import square
from service.tools.verify import Report, verify
from tests.harness.admin import create_topic
from tests.harness.kafka import KafkaService
from tests.integration.replicas import Replica, all_committed, wait_for

PARTITIONS = 8
# Both consumer group protocols: "classic" (JoinGroup/SyncGroup, the session time-out
# is the client's) and "consumer" (KIP-848: the broker assigns, and the session
# time-out is the broker's group.consumer.session.timeout.ms or the group's config).
GROUP_PROTOCOLS = ("classic", "consumer")


def long_transactions(delay_ms: int, commit_interval_ms: int) -> dict[str, str]:
    """Settings of a replica whose transactions stay open long enough for a fault
    (kill, pause) to land inside one."""
    return {"TXSTAGE_TRANSFORM": "tests.integration.transforms:slow_square",
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


def _tear_down(setup: StageSetup) -> None:
    for replica in setup.started:
        replica.kill()
    print(setup.logs())  # pytest shows it when the test failed


@pytest.fixture(autouse=True)
def no_replica_outlives_its_test() -> Iterator[None]:
    """SIGKILL whatever replica a test left running (after its fixtures' own teardown):
    a leftover once spun for the rest of a CI run against a broker long gone."""
    yield
    leftovers = Replica.kill_leftovers()
    if leftovers:
        print(f"killed replicas the test left running: {leftovers}")


@pytest.fixture(params=GROUP_PROTOCOLS)
def stage(request: pytest.FixtureRequest, kafka: KafkaService,
          unique_name: Callable[[str], str], tmp_path: Path) -> Iterator[StageSetup]:
    """A stage on the session broker: fresh topics and a factory for replicas, once
    per group protocol (test ids ``[classic]`` and ``[consumer]``).

    Every replica is SIGKILLed at teardown if still running.
    """
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path, request.param)
    yield setup
    _tear_down(setup)


@pytest.fixture(params=GROUP_PROTOCOLS)
def stage_on(request: pytest.FixtureRequest, unique_name: Callable[[str], str],
             tmp_path: Path) -> Iterator[Callable[[KafkaService], StageSetup]]:
    """``stage_on(cluster)``: the same, on a cluster of the test's own (to kill its
    brokers), once per group protocol."""
    setups: list[StageSetup] = []

    def make(cluster: KafkaService) -> StageSetup:
        setups.append(build_stage(cluster.bootstrap, unique_name, tmp_path, request.param))
        return setups[-1]

    yield make
    for setup in setups:
        _tear_down(setup)
