"""Start-up checks against a cluster that answers "not now" (chaos seed 11: a replica
started while the only broker was paused crashed with a StopIteration traceback)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
from confluent_kafka import KafkaError, KafkaException

from service.errors import ConfigError, RetriableError, UnreachableError, Where
from service.kafka.cluster import Cluster, OutputLimits
from service.preflight import check_cluster
from service.settings import load_settings

SETTINGS = load_settings({
    "TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TXSTAGE_GROUP_ID": "g",
    "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
    "TXSTAGE_TRANSFORM": "service.examples.square:square"})


def test_metadata_without_a_broker_is_the_clusters_not_now() -> None:
    cluster = Cluster({"bootstrap.servers": "127.0.0.1:1"})
    cluster._admin = MagicMock()
    cluster._admin.list_topics.return_value = SimpleNamespace(brokers={}, topics={})
    with pytest.raises(RetriableError, match="names no broker"):
        cluster.broker_config()


class _Flaky:
    """A cluster that says "not now" ``failures`` times, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.renewals = 0

    def renew(self) -> None:
        self.renewals += 1

    def topic_operations(self, topics: list[str]) -> dict[str, frozenset[str] | None]:
        if self.failures:
            self.failures -= 1
            raise RetriableError(Where("describe_topics"), KafkaError(
                KafkaError._ALL_BROKERS_DOWN, "down", retriable=True))
        return {"in": frozenset({"READ"}), "out": frozenset({"WRITE"})}

    def denial(self) -> None:
        return None

    def group_operations(self, group_id: str) -> frozenset[str]:
        return frozenset({"READ"})

    def transactions_allowed(self, config: dict[str, object]) -> bool:
        return True

    def broker_config(self) -> dict[str, str]:
        return {"transaction.max.timeout.ms": "900000"}

    def topic_config(self, topic: str) -> dict[str, str]:
        return {"max.message.bytes": "1048588"}


def test_start_up_waits_for_a_cluster_that_answers_not_now() -> None:
    cluster = _Flaky(failures=2)
    check_cluster(SETTINGS, cluster, wait_s=30)  # type: ignore[arg-type]
    assert cluster.failures == 0


class _StaleClient(_Flaky):
    """A cluster that serves again, asked through a client that never recovers from
    the outage (CI: "Failed while waiting for controller" for 80 s after the paused
    broker served again): only a new client gets answers."""

    def topic_operations(self, topics: list[str]) -> dict[str, frozenset[str] | None]:
        if not self.renewals:
            raise RetriableError(Where("describe_topics"), KafkaError(
                KafkaError._TIMED_OUT, "Failed while waiting for controller", retriable=True))
        return super().topic_operations(topics)


def test_start_up_asks_again_through_a_new_client_after_the_cluster_did_not_answer() -> None:
    cluster = _StaleClient(failures=0)
    check_cluster(SETTINGS, cluster, wait_s=5)  # type: ignore[arg-type]
    assert cluster.renewals == 1


def test_start_up_gives_up_once_the_wait_is_over_and_blames_no_setting() -> None:
    with pytest.raises(UnreachableError, match="cannot query the cluster"):
        check_cluster(SETTINGS, _Flaky(failures=100), wait_s=0)  # type: ignore[arg-type]


class _Restricted(_Flaky):
    """A cluster whose ACLs allow the principal only what ``operations`` says."""

    def __init__(self, topics: dict[str, frozenset[str] | None], group: frozenset[str],
                 transactions: bool) -> None:
        super().__init__(failures=0)
        self.topics, self.group, self.transactions = topics, group, transactions

    def topic_operations(self, topics: list[str]) -> dict[str, frozenset[str] | None]:
        return {topic: self.topics.get(topic) for topic in topics}

    def group_operations(self, group_id: str) -> frozenset[str]:
        return self.group

    def transactions_allowed(self, config: dict[str, object]) -> bool:
        return self.transactions


def test_every_missing_permission_is_one_line_naming_operation_and_resource() -> None:
    cluster = _Restricted({"in": frozenset({"DESCRIBE"}), "out": frozenset()},
                          group=frozenset({"DESCRIBE"}), transactions=False)
    with pytest.raises(ConfigError) as raised:
        check_cluster(SETTINGS, cluster, wait_s=0)  # type: ignore[arg-type]
    assert raised.value.problems == (
        "missing permission: READ on topic `in` (TXSTAGE_INPUT_TOPICS)",
        "missing permission: WRITE on topic `out` (TXSTAGE_OUTPUT_TOPIC)",
        "missing permission: READ on group `g` (TXSTAGE_GROUP_ID)",
        "missing permission: WRITE on transactional id prefix `g.` "
        "(PREFIXED; the ids are g.<topic>.<partition>)")


def test_a_topic_that_does_not_exist_is_said_so_not_called_a_permission() -> None:
    cluster = _Restricted({"in": frozenset({"READ"}), "out": None},
                          group=frozenset({"READ"}), transactions=True)
    with pytest.raises(ConfigError) as raised:
        check_cluster(SETTINGS, cluster, wait_s=0)  # type: ignore[arg-type]
    assert raised.value.problems == ("TXSTAGE_OUTPUT_TOPIC: topic 'out' does not exist",)


def test_a_renewed_cluster_asks_through_a_new_client_and_authenticates_again() -> None:
    cluster = Cluster({"bootstrap.servers": "127.0.0.1:1"})
    old = cluster._admin
    cluster._authenticated = True
    cluster.renew()
    assert cluster._admin is not old
    assert not cluster._authenticated


def _describe_failing_with(code: int) -> MagicMock:
    future = MagicMock()
    future.result.side_effect = KafkaException(KafkaError(code, "Broker transport failure"))
    admin = MagicMock()
    admin.describe_configs.side_effect = lambda resources: {resources[0]: future}
    return admin


def test_a_topic_config_asked_while_the_broker_restarts_is_the_clusters_not_now() -> None:
    # CI, 2026-11-27: a backfill slice looked its output's limit up while the only
    # broker restarted; describe_configs failed with _TRANSPORT, which was called fatal
    # and killed the task instead of being asked again.
    cluster = Cluster({"bootstrap.servers": "127.0.0.1:1"})
    cluster._admin = _describe_failing_with(KafkaError._TRANSPORT)
    with pytest.raises(RetriableError, match="_TRANSPORT"):
        cluster.topic_config("out")


def test_an_output_limit_is_asked_again_until_the_restarted_broker_answers() -> None:
    cluster = Cluster({"bootstrap.servers": "127.0.0.1:1"})
    answers = [KafkaException(KafkaError(KafkaError._TRANSPORT, "transport")),
               {"max.message.bytes": MagicMock(value="4096")}]

    def describe(resources: list[object]) -> dict[object, MagicMock]:
        future = MagicMock()
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            future.result.side_effect = answer
        else:
            future.result.return_value = answer
        return {resources[0]: future}

    cluster._admin = MagicMock()
    cluster._admin.describe_configs.side_effect = describe
    limits = OutputLimits(cluster, 1_000_000)
    assert limits("out") == 4096
    assert not answers
