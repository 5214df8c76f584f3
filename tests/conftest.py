"""Fixtures shared by every test tier.

Brokers (all real Apache Kafka, run by service/local_kafka; nothing is ever skipped):

- ``kafka`` (session): one single-node broker for the whole run, or the broker at
  ``$TXSTAGE_TEST_BOOTSTRAP`` if set. ``kafka.bootstrap`` is what clients need.
- ``cluster3``: a 3-node cluster shared by a module, healed (paused nodes resumed, dead
  ones restarted) before each test, for fault tests.
- ``make_cluster(nodes=1, overrides=None)``: a private cluster for this test only, e.g.
  to SIGKILL the only broker.
- ``proxied_kafka``: a private 1-node cluster shared by a module whose client listener is
  reached through a fault proxy (tests/harness/proxy.py): ``proxied_kafka.bootstrap``
  goes through it, ``proxied_kafka.direct_bootstrap`` past it, ``proxied_kafka.proxy``
  injects faults. Every fault is cleared and the proxy's log reset before each test.
- ``secured_kafka``: a private 1-node cluster shared by a module with a SASL_SSL listener
  (SCRAM-SHA-512, a CA made at start) and the StandardAuthorizer: clients under test use
  ``secured_kafka.secure_bootstrap`` with ``secured_kafka.secured.client_config(...)``;
  ``secured_kafka.bootstrap`` is the harness's plaintext super-user listener.

Schema registry (a real Apicurio Registry, service/local_registry; never skipped):

- ``schema_registry`` (session): one registry JVM for the whole run, started on first
  use (about 7 s); ``schema_registry.url`` is the Confluent-compatible API. A test may
  ``kill()`` it and ``start()`` it again: ports and schemas (an H2 file) are kept.

Names: ``unique_name(prefix)``, ``group_id``, ``new_topic(partitions=3, config=None)``.
Reading back: ``read_committed`` / ``read_uncommitted`` fixtures hand out the plain
functions of tests/harness/reading.py (importing them is just as good).

When a test that used a broker fails, the broker's log tail is added to its report.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping

import pytest

from service.local_kafka.cluster import KafkaCluster
from service.local_kafka.errors import LocalKafkaError
from service.local_kafka.readiness import wait_ready
from service.local_registry.process import Registry
from tests.harness import reading
from tests.harness.admin import create_topic
from tests.harness.kafka import KafkaService, ProxiedKafka, RunningKafka
from tests.harness.proxy import FaultProxy

pytest_plugins = ["tests.harness.durations"]

UniqueName = Callable[[str], str]
NewTopic = Callable[..., str]
MakeCluster = Callable[..., KafkaCluster]

_CLUSTERS_OF_TEST = pytest.StashKey[list[KafkaCluster]]()
_STARTUPS = pytest.StashKey[list[str]]()
_LOG_LINES = 80


def _started(config: pytest.Config, what: str, cluster: KafkaCluster) -> None:
    config.stash.setdefault(_STARTUPS, []).append(
        f"{what}: {cluster.size} node(s) ready in {cluster.startup_seconds:.1f} s"
    )


def _start(nodes: int, overrides: Mapping[str, str | int] | None = None, *,
           proxied: bool = False, secured: bool = False) -> KafkaCluster:
    """A started cluster, or a test failure (never a skip) carrying the broker log tail."""
    try:
        return KafkaCluster(nodes, overrides=overrides, proxied=proxied, secured=secured).start()
    except LocalKafkaError as exc:
        pytest.fail(f"could not start a {nodes}-node Kafka cluster:\n{exc}", pytrace=False)


# ----------------------------------------------------------------------------- brokers


@pytest.fixture(scope="session")
def kafka(pytestconfig: pytest.Config) -> Iterator[KafkaService]:
    external = os.environ.get("TXSTAGE_TEST_BOOTSTRAP")
    if external:
        try:
            wait_ready(external, timeout=30)
        except TimeoutError as exc:
            pytest.fail(f"TXSTAGE_TEST_BOOTSTRAP={external} is not usable: {exc}", pytrace=False)
        yield RunningKafka(external)
        return
    with _start(1) as cluster:
        _started(pytestconfig, "kafka", cluster)
        yield cluster


@pytest.fixture(scope="module")
def _cluster3_for_module(pytestconfig: pytest.Config) -> Iterator[KafkaCluster]:
    with _start(3) as cluster:
        _started(pytestconfig, "cluster3", cluster)
        yield cluster


@pytest.fixture
def cluster3(_cluster3_for_module: KafkaCluster) -> KafkaCluster:
    try:
        _cluster3_for_module.heal()
    except LocalKafkaError as exc:
        pytest.fail(f"could not heal the 3-node cluster:\n{exc}", pytrace=False)
    return _cluster3_for_module


@pytest.fixture(scope="module")
def _proxied_kafka_for_module(pytestconfig: pytest.Config) -> Iterator[ProxiedKafka]:
    with _start(1, proxied=True) as cluster:
        proxy = FaultProxy(cluster.proxy_routes)
        try:
            proxy.start()
        except OSError as exc:
            pytest.fail(f"could not start the fault proxy on {cluster.proxy_routes}: {exc}",
                        pytrace=False)
        try:
            wait_ready(cluster.bootstrap, broker_ids=set(cluster.node_ids), timeout=60)
        except TimeoutError as exc:
            proxy.stop()
            pytest.fail(f"Kafka is not reachable through the fault proxy: {exc}\n"
                        f"{cluster.log_tail()}", pytrace=False)
        _started(pytestconfig, "proxied_kafka", cluster)
        try:
            yield ProxiedKafka(cluster, proxy)
        finally:
            proxy.stop()


@pytest.fixture
def proxied_kafka(_proxied_kafka_for_module: ProxiedKafka) -> Iterator[ProxiedKafka]:
    _proxied_kafka_for_module.proxy.reset()
    yield _proxied_kafka_for_module
    _proxied_kafka_for_module.proxy.clear()  # release whatever a failed test left held


@pytest.fixture(scope="module")
def secured_kafka(pytestconfig: pytest.Config) -> Iterator[KafkaCluster]:
    with _start(1, secured=True) as cluster:
        _started(pytestconfig, "secured_kafka", cluster)
        yield cluster


@pytest.fixture
def make_cluster(request: pytest.FixtureRequest) -> Iterator[MakeCluster]:
    clusters = request.node.stash.setdefault(_CLUSTERS_OF_TEST, [])

    def make(nodes: int = 1, overrides: Mapping[str, str | int] | None = None) -> KafkaCluster:
        cluster = _start(nodes, overrides)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.close()


@pytest.fixture(scope="session")
def schema_registry(pytestconfig: pytest.Config,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    registry = Registry(tmp_path_factory.mktemp("registry"))
    try:
        registry.start()
    except LocalKafkaError as exc:
        pytest.fail(f"could not start the schema registry:\n{exc}", pytrace=False)
    pytestconfig.stash.setdefault(_STARTUPS, []).append(
        f"schema_registry: ready in {registry.startup_seconds:.1f} s")
    with registry:
        yield registry


# ------------------------------------------------------------------------------- names


@pytest.fixture
def unique_name() -> UniqueName:
    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture
def group_id(unique_name: UniqueName) -> str:
    return unique_name("group")


@pytest.fixture
def new_topic(kafka: KafkaService, unique_name: UniqueName) -> NewTopic:
    def make(
        partitions: int = 3,
        config: Mapping[str, str | int] | None = None,
        *,
        prefix: str = "topic",
        replication_factor: int | None = None,
    ) -> str:
        return create_topic(
            kafka.bootstrap,
            unique_name(prefix),
            partitions=partitions,
            replication_factor=replication_factor,
            config=config,
        )

    return make


@pytest.fixture
def read_committed() -> Callable[..., list[reading.ReadRecord]]:
    return reading.read_committed


@pytest.fixture
def read_uncommitted() -> Callable[..., list[reading.ReadRecord]]:
    return reading.read_uncommitted


# ---------------------------------------------------------------------------- reports


def _brokers_used(item: pytest.Item) -> list[tuple[str, KafkaService]]:
    used: list[tuple[str, KafkaService]] = []
    funcargs = getattr(item, "funcargs", {})
    for name in ("kafka", "cluster3", "proxied_kafka", "secured_kafka"):
        service = funcargs.get(name)
        if service is not None:
            used.append((name, service))
    clusters: list[KafkaCluster] = item.stash.get(_CLUSTERS_OF_TEST, [])
    for number, cluster in enumerate(clusters):
        used.append((f"make_cluster #{number}", cluster))
    return used


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for name, service in _brokers_used(item):
            try:
                tail = service.log_tail(_LOG_LINES)
            except OSError as exc:
                tail = f"(log unavailable: {exc})"
            report.sections.append((f"Kafka log tail: {name}", tail))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    startups = terminalreporter.config.stash.get(_STARTUPS, [])
    if startups:
        terminalreporter.write_sep("-", "Kafka brokers started for the tests")
        for line in startups:
            terminalreporter.write_line(line)
