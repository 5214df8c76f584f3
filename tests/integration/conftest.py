"""Fixtures for tests that run the stage as real processes against the real broker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from service.examples.square import square
from service.records import Transform
from service.verify import Report, verify
from tests.harness.kafka import KafkaService
from tests.integration.replicas import Replica

PARTITIONS = 8


@dataclass
class StageSetup:
    """Topics, group and settings of one stage under test."""

    bootstrap: str
    input_topic: str
    output_topic: str
    dlq_topic: str
    group_id: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    started: list[Replica] = field(default_factory=list)

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

    def logs(self) -> str:
        return "\n".join(f"--- {r.name} (pid {r.proc.pid if r.proc else '?'})\n{r.log_tail()}"
                         for r in self.started)


@pytest.fixture
def stage(kafka: KafkaService, new_topic: Callable[..., str], group_id: str,
          tmp_path: Path) -> Iterator[StageSetup]:
    """A fresh input (8 partitions), output and DLQ topic, and a factory for replicas.

    Every replica is SIGKILLed at teardown if still running; logs are printed
    (pytest shows them when the test fails).
    """
    setup = StageSetup(
        bootstrap=kafka.bootstrap,
        input_topic=new_topic(PARTITIONS, prefix="in"),
        output_topic=new_topic(4, prefix="out"),
        dlq_topic=new_topic(1, prefix="dlq"),
        group_id=group_id,
        log_dir=tmp_path,
    )
    setup.env = {
        "TXSTAGE_BOOTSTRAP_SERVERS": kafka.bootstrap,
        "TXSTAGE_GROUP_ID": group_id,
        "TXSTAGE_INPUT_TOPICS": setup.input_topic,
        "TXSTAGE_OUTPUT_TOPIC": setup.output_topic,
        "TXSTAGE_DLQ_TOPIC": setup.dlq_topic,
        "TXSTAGE_TRANSFORM": "service.examples.square:square",
        "TXSTAGE_LOG_FORMAT": "json",
        # Short session so that a killed or paused replica's partitions move in
        # seconds (the test broker allows group.min.session.timeout.ms=1000).
        "TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS": "6000",
        "TXSTAGE_CONSUMER__HEARTBEAT_INTERVAL_MS": "500",
    }
    yield setup
    for replica in setup.started:
        replica.kill()
    print(setup.logs())
