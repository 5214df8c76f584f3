"""The brokers tests get: the product's local Kafka runner (:mod:`service.local_kafka`),
re-exported, plus what the fixtures hand out when the suite did not start the broker.

Import the runner from ``service.local_kafka.*`` in new code; these names stay so that a
test can say ``from tests.harness.kafka import KafkaCluster, KafkaService``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from service.local_kafka.cluster import KafkaCluster
from service.local_kafka.errors import KafkaStartError, LocalKafkaError
from service.local_kafka.jars import KAFKA_VERSION, install
from service.local_kafka.node import free_ports
from service.local_kafka.properties import broker_properties, kafka_uuid
from service.local_kafka.readiness import wait_ready
from tests.harness.proxy import FaultProxy

__all__ = [
    "KAFKA_VERSION",
    "KafkaCluster",
    "KafkaService",
    "KafkaStartError",
    "LocalKafkaError",
    "ProxiedKafka",
    "RunningKafka",
    "broker_properties",
    "free_ports",
    "install",
    "kafka_uuid",
    "wait_ready",
]


class KafkaService(Protocol):
    """What the test fixtures hand out: a broker to talk to, and its logs for failures."""

    @property
    def bootstrap(self) -> str: ...

    def log_tail(self, lines: int = 80) -> str: ...


@dataclass(frozen=True)
class RunningKafka:
    """A broker the suite did not start (``TXSTAGE_TEST_BOOTSTRAP``): no logs, no faults."""

    bootstrap: str

    def log_tail(self, lines: int = 80) -> str:
        return f"(external broker at {self.bootstrap}: its logs are not available here)"


@dataclass(frozen=True)
class ProxiedKafka:
    """A ``KafkaCluster(proxied=True)`` and the fault proxy in front of it.

    ``bootstrap`` goes through the proxy (give it to the stage), ``direct_bootstrap``
    past it (verifiers, admin calls, feeding input); ``proxy`` injects the faults.
    """

    cluster: KafkaCluster
    proxy: FaultProxy

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def direct_bootstrap(self) -> str:
        return self.cluster.direct_bootstrap

    def log_tail(self, lines: int = 80) -> str:
        return f"{self.cluster.log_tail(lines)}\n==== fault proxy ====\n{self.proxy.describe()}"
