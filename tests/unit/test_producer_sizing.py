"""The producers' message.max.bytes comes from the topics they write (the largest
max.message.bytes of the output and dead-letter topics) unless the user set it, and
an input topic that takes records larger than the dead-letter topic holds is a
warning, not a problem."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from service.errors import ConfigError, DeniedError, Where
from service.kafka.cluster import DEFAULT_MESSAGE_MAX_BYTES
from service.kafka.config import producer_config
from service.preflight import check_cluster, producer_max_bytes, sized_max_bytes
from service.settings import Settings, load_settings

BASE = {"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TXSTAGE_GROUP_ID": "g",
        "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
        "TXSTAGE_DLQ_TOPIC": "dlq", "TXSTAGE_TRANSFORM": "service.examples.square:square"}


def _settings(**extra: str) -> Settings:
    return load_settings({**BASE, **extra})


def test_sized_from_the_largest_topic_limit() -> None:
    assert producer_max_bytes(_settings(), [1_048_588, 5_000_000]) == 5_000_000
    assert producer_max_bytes(_settings(), [1_048_588]) == 1_048_588


def test_librdkafkas_default_when_no_limit_is_known() -> None:
    assert producer_max_bytes(_settings()) == DEFAULT_MESSAGE_MAX_BYTES == 1_000_000


def test_kept_within_librdkafkas_range() -> None:
    assert producer_max_bytes(_settings(), [2_147_483_647]) == 1_000_000_000
    assert producer_max_bytes(_settings(), [500]) == 1_000


@pytest.mark.parametrize("variable", ["TXSTAGE_PRODUCER__MESSAGE_MAX_BYTES",
                                      "TXSTAGE_KAFKA__MESSAGE_MAX_BYTES"])
def test_a_size_the_user_set_wins(variable: str) -> None:
    settings = _settings(**{variable: "2000000"})
    assert producer_max_bytes(settings, [1_048_588, 5_000_000]) == 2_000_000
    config = producer_config(settings, "g.in.0", message_max_bytes=5_000_000)
    assert config["message.max.bytes"] == "2000000"


def test_the_size_reaches_the_producer_config() -> None:
    assert producer_config(_settings(), None, message_max_bytes=1_048_588)[
        "message.max.bytes"] == 1_048_588
    assert "message.max.bytes" not in producer_config(_settings(), None)


class _Cluster:
    """Every check passes; topics' max.message.bytes as given (None: denied)."""

    def __init__(self, limits: dict[str, int | None]) -> None:
        self.limits = limits

    def renew(self) -> None:
        pass

    def denial(self) -> None:
        return None

    def topic_operations(self, topics: list[str]) -> dict[str, frozenset[str]]:
        return {t: frozenset({"READ", "WRITE"}) for t in topics}

    def group_operations(self, group_id: str) -> frozenset[str]:
        return frozenset({"READ"})

    def transactions_allowed(self, config: dict[str, object]) -> bool:
        return True

    def broker_config(self) -> dict[str, str]:
        return {"transaction.max.timeout.ms": "900000"}

    def topic_config(self, topic: str) -> dict[str, str]:
        limit = self.limits[topic]
        if limit is None:
            raise DeniedError(Where("describe_configs", topic=topic), KafkaError(
                KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))
        return {"max.message.bytes": str(limit)}


DEFAULTS = {"in": 1_048_588, "out": 1_048_588, "dlq": 1_048_588}


def test_the_checks_size_the_producers_from_output_and_dead_letter_topics() -> None:
    cluster = _Cluster({**DEFAULTS, "out": 400_000, "dlq": 3_000_000, "in": 3_000_000})
    checked = check_cluster(_settings(), cluster)  # type: ignore[arg-type]
    assert checked.producer_max_bytes == 3_000_000
    assert checked.warnings == ()
    assert sized_max_bytes(_settings(), cluster) == 3_000_000  # type: ignore[arg-type]


def test_topic_defaults_size_the_producers_to_the_topic_default() -> None:
    checked = check_cluster(_settings(), _Cluster(DEFAULTS))  # type: ignore[arg-type]
    assert checked.producer_max_bytes == 1_048_588
    assert checked.warnings == ()


def test_an_unreadable_limit_is_left_out() -> None:
    cluster = _Cluster({**DEFAULTS, "out": None, "dlq": 2_000_000})
    checked = check_cluster(_settings(), cluster)  # type: ignore[arg-type]
    assert checked.producer_max_bytes == 2_000_000
    nothing = _Cluster({"in": None, "out": None, "dlq": None})
    assert check_cluster(_settings(), nothing).producer_max_bytes == 1_000_000  # type: ignore[arg-type]


def test_an_input_larger_than_the_dead_letter_topic_holds_is_one_warning() -> None:
    cluster = _Cluster({**DEFAULTS, "in": 5_000_000})
    [warning] = check_cluster(_settings(), cluster).warnings  # type: ignore[arg-type]
    assert warning.startswith("input topic 'in' max.message.bytes=5000000 is larger than the "
                              "dead-letter topic 'dlq' holds (1048588 bytes")
    assert warning.endswith("raise topic 'dlq' max.message.bytes to 5000000")
    assert "\n" not in warning


def test_a_producer_size_the_user_set_below_the_input_is_named_in_the_warning() -> None:
    settings = _settings(TXSTAGE_PRODUCER__MESSAGE_MAX_BYTES="1000000")
    [warning] = check_cluster(settings, _Cluster(DEFAULTS)).warnings  # type: ignore[arg-type]
    assert "holds (1000000 bytes" in warning
    assert warning.endswith("set TXSTAGE_PRODUCER__MESSAGE_MAX_BYTES=1048588")


def test_no_warning_without_a_dead_letter_topic() -> None:
    settings = load_settings({k: v for k, v in BASE.items() if k != "TXSTAGE_DLQ_TOPIC"})
    cluster = _Cluster({**DEFAULTS, "in": 5_000_000})
    assert check_cluster(settings, cluster).warnings == ()  # type: ignore[arg-type]


def test_a_size_the_user_set_above_a_topic_is_still_a_problem() -> None:
    settings = _settings(TXSTAGE_KAFKA__MESSAGE_MAX_BYTES="2000000")
    with pytest.raises(ConfigError, match="set TXSTAGE_KAFKA__MESSAGE_MAX_BYTES=1048588"):
        check_cluster(settings, _Cluster(DEFAULTS))  # type: ignore[arg-type]
