"""Settings: the exactly-once properties cannot be overridden; problems are named."""

import pytest

from service.errors import ConfigError
from service.kafka.config import consumer_config, producer_config, refused_configs
from service.settings import load_settings

BASE = {
    "TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
    "TXSTAGE_GROUP_ID": "grp",
    "TXSTAGE_INPUT_TOPICS": "in-a, in-b",
    "TXSTAGE_OUTPUT_TOPIC": "out",
    "TXSTAGE_TRANSFORM": "service.examples.square:square",
}


def test_defaults_and_comma_separated_topics() -> None:
    settings = load_settings(BASE)
    assert settings.input_topics == ("in-a", "in-b")
    assert settings.guarantee == "exactly_once"
    assert settings.commit_interval_ms == 100
    assert settings.id_prefix == "grp"
    assert settings.transactional_id("in-a", 7) == "grp.in-a.7"


def test_transactional_id_prefix_overrides_group_id() -> None:
    settings = load_settings({**BASE, "TXSTAGE_TRANSACTIONAL_ID_PREFIX": "stage1"})
    assert settings.transactional_id("in-b", 0) == "stage1.in-b.0"


def test_consumer_reads_committed_and_never_auto_commits() -> None:
    config = consumer_config(load_settings({**BASE, "TXSTAGE_KAFKA__FETCH_MAX_BYTES": "1024"}))
    assert config["isolation.level"] == "read_committed"
    assert config["enable.auto.commit"] is False
    assert config["enable.auto.offset.store"] is False
    assert config["partition.assignment.strategy"] == "cooperative-sticky"
    assert config["fetch.max.bytes"] == "1024"


def test_classic_members_heartbeat_a_tenth_of_their_session_at_most_every_3_s() -> None:
    # Survivors learn of a dead member's rebalance at their next heartbeat.
    def heartbeat(**env: str) -> object:
        return consumer_config(load_settings({**BASE, **env})).get("heartbeat.interval.ms")

    assert heartbeat() == 3_000  # the 45 s default session: librdkafka's own default
    assert heartbeat(TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS="10000") == 1_000
    assert heartbeat(TXSTAGE_KAFKA__SESSION_TIMEOUT_MS="6000") == 600  # set for every client
    assert heartbeat(TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS="10000",
                     TXSTAGE_CONSUMER__HEARTBEAT_INTERVAL_MS="2500") == "2500"  # told
    assert heartbeat(TXSTAGE_GROUP_PROTOCOL="consumer") is None  # the broker's setting


def test_producer_is_idempotent_and_pinned() -> None:
    settings = load_settings({**BASE, "TXSTAGE_PRODUCER__LINGER_MS": "20"})
    config = producer_config(settings, "grp.in-a.0")
    assert config["enable.idempotence"] is True
    assert config["transactional.id"] == "grp.in-a.0"
    assert config["transaction.timeout.ms"] == settings.transaction_timeout_ms
    assert config["linger.ms"] == "20"
    assert "transactional.id" not in producer_config(settings, None)


def test_pinned_producers_linger_50_ms_and_the_shared_one_20_unless_told_otherwise() -> None:
    # commit_transaction flushes whatever the linger: read_committed readers see no delay
    settings = load_settings(BASE)
    assert producer_config(settings, "grp.in-a.0")["linger.ms"] == 50
    assert producer_config(settings, None)["linger.ms"] == 20
    told = load_settings({**BASE, "TXSTAGE_PRODUCER__LINGER_MS": "5"})
    assert producer_config(told, "grp.in-a.0")["linger.ms"] == "5"


def test_transactional_producers_do_not_rebootstrap_unless_told_to() -> None:
    # librdkafka #5511: a re-bootstrap can leave send_offsets_to_transaction hung
    settings = load_settings(BASE)
    assert producer_config(settings, "grp.in-a.0")["metadata.recovery.strategy"] == "none"
    assert "metadata.recovery.strategy" not in producer_config(settings, None)
    told = load_settings({**BASE, "TXSTAGE_PRODUCER__METADATA_RECOVERY_STRATEGY": "rebootstrap"})
    assert producer_config(told, "grp.in-a.0")["metadata.recovery.strategy"] == "rebootstrap"


def test_transactional_producers_close_idle_connections_unless_told_not_to() -> None:
    # librdkafka #5511: the closing of an idle connection wakes a send_offsets_to_transaction
    # that waits for a dead group coordinator (test_stage_cluster_faults shows it on a cluster)
    settings = load_settings(BASE)
    assert producer_config(settings, "grp.in-a.0")["connections.max.idle.ms"] == 30_000
    assert "connections.max.idle.ms" not in producer_config(settings, None)
    told = load_settings({**BASE, "TXSTAGE_PRODUCER__CONNECTIONS_MAX_IDLE_MS": "0"})
    assert producer_config(told, "grp.in-a.0")["connections.max.idle.ms"] == "0"


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("TXSTAGE_KAFKA__ISOLATION_LEVEL", "read_uncommitted", "isolation.level cannot be set"),
        ("TXSTAGE_CONSUMER__ENABLE_AUTO_COMMIT", "true", "enable.auto.commit cannot be set"),
        ("TXSTAGE_PRODUCER__TRANSACTIONAL_ID", "x", "transactional.id cannot be set"),
        ("TXSTAGE_COMMIT_INTERVAL_MS", "0", "TXSTAGE_COMMIT_INTERVAL_MS"),
        ("TXSTAGE_COMMIT_INTERVAL_MS", "30000", "at most a tenth of TXSTAGE_TRANSACTION_TIMEOUT"),
        ("TXSTAGE_GUARANTEE", "maybe_once", "TXSTAGE_GUARANTEE"),
        ("TXSTAGE_OUTPUT_TOPIC", "in-a", "must not be one of the input topics"),
        ("TXSTAGE_CONSUMER__AUTO_OFFSET_RESET", "error",
         "TXSTAGE_CONSUMER__auto.offset.reset=error cannot be used"),
        ("TXSTAGE_KAFKA__AUTO_OFFSET_RESET", "newest", "auto.offset.reset=newest cannot be used"),
    ],
)
def test_bad_settings_are_named(name: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({**BASE, name: value})
    assert any(fragment in problem for problem in caught.value.problems), caught.value.problems


@pytest.mark.parametrize(("env", "at_end"), [
    ({}, False),
    ({"TXSTAGE_CONSUMER__AUTO_OFFSET_RESET": "latest"}, True),
    ({"TXSTAGE_KAFKA__AUTO_OFFSET_RESET": "largest"}, True),
    ({"TXSTAGE_CONSUMER__AUTO_OFFSET_RESET": "smallest"}, False),
    ({"TXSTAGE_KAFKA__AUTO_OFFSET_RESET": "end",
      "TXSTAGE_CONSUMER__AUTO_OFFSET_RESET": "earliest"}, False),  # the consumer's wins
])
def test_where_a_partition_with_nothing_committed_starts(env: dict[str, str],
                                                         at_end: bool) -> None:
    # The loop once read the masked value (SecretStr), so "latest" was never seen.
    settings = load_settings({**BASE, **env})
    assert settings.starts_at_end is at_end
    assert consumer_config(settings)["auto.offset.reset"] == (
        env.get("TXSTAGE_CONSUMER__AUTO_OFFSET_RESET")
        or env.get("TXSTAGE_KAFKA__AUTO_OFFSET_RESET", "earliest"))


@pytest.mark.parametrize(("env", "fragment"), [
    ({"TXSTAGE_PRODUCER__MESSAGE_TIMEOUT_MS": "120000"},
     "pinned producer configuration: Failed to create producer: `message.timeout.ms`"),
    ({"TXSTAGE_KAFKA__SOCKET_TIMEOUT_MS": "120000"}, "`socket.timeout.ms` must be set <="),
    ({"TXSTAGE_CONSUMER__FETCH_MAX_BYTES": "lots"},
     'consumer configuration: Invalid value for configuration property "fetch.max.bytes"'),
])
def test_what_librdkafka_refuses_is_named_before_anything_starts(env: dict[str, str],
                                                                 fragment: str) -> None:
    # Each setting passes alone; librdkafka refuses the combination when it builds the
    # client, which used to be the first pinned producer: a traceback and exit 1.
    [problem] = refused_configs(load_settings({**BASE, **env}))
    assert fragment in problem, problem
    assert refused_configs(load_settings(BASE)) == []


def test_every_problem_gets_its_own_line() -> None:
    env = {k: v for k, v in BASE.items() if k != "TXSTAGE_BOOTSTRAP_SERVERS"}
    with pytest.raises(ConfigError) as caught:
        load_settings({**env, "TXSTAGE_INPUT_TOPICS": "", "TXSTAGE_KAFKA__GROUP_ID": "x"})
    problems = caught.value.problems
    assert any(p.startswith("TXSTAGE_BOOTSTRAP_SERVERS") for p in problems)
    assert any(p.startswith("TXSTAGE_INPUT_TOPICS") for p in problems)
    assert len(problems) >= 2


def test_passthrough_secrets_are_not_shown() -> None:
    settings = load_settings({**BASE, "TXSTAGE_KAFKA__SASL_PASSWORD": "hunter2"})
    assert "hunter2" not in repr(settings)
    assert producer_config(settings, None)["sasl.password"] == "hunter2"


def test_a_passthrough_value_can_come_from_a_mounted_file(tmp_path: object) -> None:
    from pathlib import Path

    secret = Path(str(tmp_path)) / "kafka-password"
    secret.write_text("s3cret from a file\n")
    settings = load_settings({**BASE, "TXSTAGE_KAFKA_FILE__SASL_PASSWORD": str(secret),
                              "TXSTAGE_PRODUCER_FILE__sasl.username": str(secret)})
    assert producer_config(settings, None)["sasl.password"] == "s3cret from a file"
    assert consumer_config(settings)["sasl.password"] == "s3cret from a file"
    assert producer_config(settings, None)["sasl.username"] == "s3cret from a file"
    assert "s3cret" not in repr(settings)


def test_an_unreadable_passthrough_file_is_named_and_its_content_never_shown() -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings({**BASE, "TXSTAGE_KAFKA_FILE__SASL_PASSWORD": "/nonexistent/pw"})
    assert str(raised.value) == ("TXSTAGE_KAFKA_FILE__SASL_PASSWORD: cannot read "
                                 "/nonexistent/pw: No such file or directory")


def test_dotenv_carries_passthrough_and_the_environment_wins(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    directory = Path(str(tmp_path))
    (directory / ".env").write_text(
        "".join(f"{k}={v}\n" for k, v in BASE.items())
        + "TXSTAGE_KAFKA__SASL_USERNAME=from-dotenv\nTXSTAGE_GROUP_ID=dotenv-group\n")
    monkeypatch.chdir(directory)
    monkeypatch.setenv("TXSTAGE_GROUP_ID", "env-group")
    settings = load_settings()
    assert settings.kafka["sasl.username"].get_secret_value() == "from-dotenv"
    assert settings.group_id == "env-group"


def test_workers_with_a_registry_format_is_refused_naming_both() -> None:
    # The codecs decode and encode in the main process; a worker would get the wire
    # bytes and its outputs would never be encoded.
    from service.errors import ConfigError
    from service.settings import load_settings

    env = {"TXSTAGE_BOOTSTRAP_SERVERS": "k:9092", "TXSTAGE_GROUP_ID": "g",
           "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
           "TXSTAGE_TRANSFORM": "service.examples.square:square", "TXSTAGE_WORKERS": "2",
           "TXSTAGE_INPUT_VALUE_FORMAT": "json"}
    try:
        load_settings(env)
    except ConfigError as exc:
        assert any("TXSTAGE_WORKERS=2 runs only a bytes transform" in p
                   for p in exc.problems), exc.problems
    else:
        raise AssertionError("accepted")
