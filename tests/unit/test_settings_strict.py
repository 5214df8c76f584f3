"""Settings are strict: a TXSTAGE_* name that is not a setting is an error
with a did-you-mean, bootstrap servers are checked at once, every problem is reported
in one run, and a refused pass-through names the variable the user set."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from service.errors import ConfigError
from service.kafka.config import refused_configs
from service.settings import load_settings

BASE = {
    "TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
    "TXSTAGE_GROUP_ID": "grp",
    "TXSTAGE_INPUT_TOPICS": "in-a, in-b",
    "TXSTAGE_OUTPUT_TOPIC": "out",
    "TXSTAGE_TRANSFORM": "service.examples.square:square",
}
REPO = Path(__file__).resolve().parents[2]


def problems_of(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load_settings(env)
    return list(raised.value.problems)


# --- names that are not settings ---------------------------------------------------


@pytest.mark.parametrize(("name", "meant"), [
    ("TXSTAGE_COMIT_INTERVAL_MS", "TXSTAGE_COMMIT_INTERVAL_MS"),
    ("TXSTAGE_BATCH_SIZ", "TXSTAGE_BATCH_SIZE"),
    ("TXSTAGE_GROUPID", "TXSTAGE_GROUP_ID"),
    ("txstage_log_levl", "TXSTAGE_LOG_LEVEL"),  # names are case-insensitive
    ("TXSTAGE_KAFKA_SASL_PASSWORD", "TXSTAGE_KAFKA__SASL_PASSWORD"),  # one underscore short
    ("TXSTAGE_PRODUCERS__LINGER_MS", "TXSTAGE_PRODUCER__LINGER_MS"),
    ("TXSTAGE_KAFKA_FILE_SASL_PASSWORD", "TXSTAGE_KAFKA_FILE__SASL_PASSWORD"),
])
def test_a_txstage_name_that_is_not_a_setting_is_refused_with_a_did_you_mean(
        name: str, meant: str) -> None:
    assert problems_of({**BASE, name: "500"}) == [
        f"{name}: not a setting (did you mean {meant}?)"]


def test_a_txstage_name_like_no_setting_is_refused_without_a_guess() -> None:
    assert problems_of({**BASE, "TXSTAGE_WHATEVER": "1"}) == ["TXSTAGE_WHATEVER: not a setting"]


def test_a_pass_through_family_without_a_property_is_refused() -> None:
    assert problems_of({**BASE, "TXSTAGE_KAFKA__": "x", "TXSTAGE_PRODUCER": "{}"}) == [
        "TXSTAGE_KAFKA__: names no librdkafka property (set TXSTAGE_KAFKA__<property>)",
        "TXSTAGE_PRODUCER: not a setting (librdkafka properties are set one by one, "
        "as TXSTAGE_PRODUCER__<property>)",
    ]


def test_a_typo_in_dotenv_or_the_environment_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in BASE.items())
                                   + "TXSTAGE_BATCH_SIZ=10\n")
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.upper().startswith("TXSTAGE_")]:
        monkeypatch.delenv(name)  # whatever the shell running the tests has
    monkeypatch.setenv("TXSTAGE_COMIT_INTERVAL_MS", "500")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert raised.value.problems == (
        "TXSTAGE_BATCH_SIZ: not a setting (did you mean TXSTAGE_BATCH_SIZE?)",
        "TXSTAGE_COMIT_INTERVAL_MS: not a setting (did you mean TXSTAGE_COMMIT_INTERVAL_MS?)",
    )


# Not settings, yet set where stages run (a developer's shell, make test, the test
# suite's environment, which every replica it starts inherits): refusing one would
# make every replica exit 2.
@pytest.mark.parametrize("name", [
    "TXSTAGE_CACHE_DIR", "TXSTAGE_SPARK_LOG_LEVEL", "TXSTAGE_EXAMPLE_SUMMARY_TOPIC",
    "TXSTAGE_PROMTOOL", "TXSTAGE_IMAGE_TAG", "TXSTAGE_TEST_BOOTSTRAP",
    "TXSTAGE_TEST_STAGE_TREE", "TXSTAGE_TEST_DURATIONS", "TXSTAGE_TEST_BASE",
    "TXSTAGE_TEST_A_LATER_KNOB", "TXSTAGE_SPARK_A_LATER_KNOB",
])
def test_names_the_project_uses_that_are_not_settings_are_accepted(name: str) -> None:
    assert load_settings({**BASE, name: "x"}).group_id == "grp"


# How code and scripts read an environment variable (assignments in the Makefile and
# shell scripts too: they reach the processes they start).
READS = re.compile(r"""(?:environ\.get\(|environ\[|getenv\(|\$\{?)["']?(TXSTAGE_[A-Za-z0-9_]+)"""
                   r"""|^\s*(TXSTAGE_[A-Za-z0-9_]+)=|\s(TXSTAGE_[A-Za-z0-9_]+)=["$]""",
                   re.MULTILINE)


def test_every_txstage_name_the_repository_reads_is_accepted() -> None:
    from service.settings import is_allowed_name

    read: dict[str, str] = {}
    for directory, subdirs, files in os.walk(REPO):
        subdirs[:] = [d for d in subdirs if d == ".ci" or not d.startswith((".", "__"))]
        for file in files:
            path = Path(directory, file)
            if path.suffix not in {".py", ".sh"} and file != "Makefile" \
                    and path.parent.name != ".ci":
                continue
            for match in READS.finditer(path.read_text(encoding="utf-8", errors="replace")):
                name = next(group for group in match.groups() if group)
                read.setdefault(name, str(path.relative_to(REPO)))
    assert "TXSTAGE_TEST_STAGE_TREE" in read and "TXSTAGE_PROMTOOL" in read  # the scan works
    refused = {name: where for name, where in read.items() if not is_allowed_name(name)}
    assert not refused, f"read but refused by load_settings (add to NOT_SETTINGS): {refused}"


def test_every_allowed_name_that_is_not_a_setting_is_documented() -> None:
    from service.settings import NOT_SETTING_PREFIXES, NOT_SETTINGS

    operations = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = [name for name in [*NOT_SETTINGS, *NOT_SETTING_PREFIXES]
               if f"`{name}" not in operations]
    assert not missing, missing


# --- bootstrap servers ---------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "  ", ","])
def test_empty_bootstrap_servers_are_a_config_error_at_once(value: str) -> None:
    [problem] = problems_of({**BASE, "TXSTAGE_BOOTSTRAP_SERVERS": value})
    assert problem.startswith("TXSTAGE_BOOTSTRAP_SERVERS: empty: name the brokers as "
                              "comma-separated host:port"), problem


@pytest.mark.parametrize(("value", "why"), [
    ("not a host", "('not a host' has a space)"),
    ("kafka", "('kafka' has no port)"),
    ("kafka:0", "('kafka:0' has the port 0, not 1-65535)"),
    ("kafka:65536", "('kafka:65536' has the port 65536, not 1-65535)"),
    ("kafka:http", "('kafka:http' is not host:port)"),
    ("a:1,b:2,c", "('c' has no port)"),
    ("::1:9092", "('::1:9092' needs brackets around its IPv6 address)"),
    ("a:9092;b:9092", "('a:9092;b:9092' has a ';': separate brokers with commas)"),
    ("a:9092,b:9092;", "('b:9092;' has a ';': separate brokers with commas)"),
    ("[::1]", "('[::1]' is not host:port)"),
    ("[no:such:v6]:9092", "('[no:such:v6]:9092' is not host:port)"),
    ("ka$ka:9092", "('ka$ka:9092' is not host:port)"),
    (":9092", "(':9092' is not host:port)"),
])
def test_malformed_bootstrap_servers_are_a_config_error_quoting_the_whole_value(
        value: str, why: str) -> None:
    [problem] = problems_of({**BASE, "TXSTAGE_BOOTSTRAP_SERVERS": value})
    assert problem.startswith(f"TXSTAGE_BOOTSTRAP_SERVERS: {value!r} is not a comma-separated "
                              "list of host:port, e.g. kafka-1:9092,kafka-2:9092 or [::1]:9092 "
                              ), problem
    assert problem.endswith(why), problem


@pytest.mark.parametrize("value", [
    "kafka:9092", "127.0.0.1:1, 127.0.0.1:65535", "[::1]:9092,[fe80::1%eth0]:9093",
    "broker_1.example.com:9093", "SASL_SSL://broker.example.com:9093", "a:1,b:2,",
])
def test_well_formed_bootstrap_servers_are_accepted(value: str) -> None:
    assert load_settings({**BASE, "TXSTAGE_BOOTSTRAP_SERVERS": value}).bootstrap_servers == value


# --- every problem at once -----------------------------------------------------------


def test_every_problem_is_reported_at_once_one_line_each() -> None:
    env = {k: v for k, v in BASE.items() if k != "TXSTAGE_GROUP_ID"}
    assert problems_of({**env, "TXSTAGE_COMIT_INTERVAL_MS": "500", "TXSTAGE_BATCH_SIZE": "lots",
                        "TXSTAGE_OUTPUT_TOPIC": "in-a", "TXSTAGE_BOOTSTRAP_SERVERS": "not a host",
                        "TXSTAGE_KAFKA_FILE__SASL_PASSWORD": "/nonexistent/pw"}) == [
        "TXSTAGE_COMIT_INTERVAL_MS: not a setting (did you mean TXSTAGE_COMMIT_INTERVAL_MS?)",
        "TXSTAGE_KAFKA_FILE__SASL_PASSWORD: cannot read /nonexistent/pw: "
        "No such file or directory",
        "TXSTAGE_BOOTSTRAP_SERVERS: 'not a host' is not a comma-separated list of host:port, "
        "e.g. kafka-1:9092,kafka-2:9092 or [::1]:9092 ('not a host' has a space)",
        "TXSTAGE_GROUP_ID: Field required",
        "TXSTAGE_BATCH_SIZE: Input should be a valid integer, unable to parse string as an "
        "integer",
        "TXSTAGE_OUTPUT_TOPIC must not be one of the input topics",
    ]


def test_a_bad_value_does_not_hide_settings_that_do_not_go_together() -> None:
    assert problems_of({**BASE, "TXSTAGE_BATCH_SIZE": "0", "TXSTAGE_COMMIT_INTERVAL_MS": "30000",
                        "TXSTAGE_KAFKA__ISOLATION_LEVEL": "read_uncommitted"}) == [
        "TXSTAGE_BATCH_SIZE: Input should be greater than 0",
        "TXSTAGE_KAFKA__isolation.level cannot be set: exactly-once reads only committed "
        "input (read_committed)",
        "TXSTAGE_COMMIT_INTERVAL_MS=30000 must be at most a tenth of "
        "TXSTAGE_TRANSACTION_TIMEOUT_MS=60000",
    ]


def test_no_settings_at_all_is_one_line_per_missing_setting() -> None:
    # The missing topics' stand-ins were spelt alike, and "the output topic is one of
    # the input topics" followed the five lines.
    assert problems_of({}) == [f"{name}: Field required" for name in (
        "TXSTAGE_BOOTSTRAP_SERVERS", "TXSTAGE_GROUP_ID", "TXSTAGE_INPUT_TOPICS",
        "TXSTAGE_OUTPUT_TOPIC", "TXSTAGE_TRANSFORM")]


def test_a_topic_conflict_is_not_checked_between_two_missing_topics() -> None:
    env = {k: v for k, v in BASE.items() if k not in ("TXSTAGE_INPUT_TOPICS",
                                                      "TXSTAGE_OUTPUT_TOPIC")}
    assert problems_of(env) == ["TXSTAGE_INPUT_TOPICS: Field required",
                                "TXSTAGE_OUTPUT_TOPIC: Field required"]


@pytest.mark.parametrize(("env", "expected"), [
    # The bad value's default (100) must not stand in for it: 100 * 10 > 500.
    ({"TXSTAGE_COMMIT_INTERVAL_MS": "lots", "TXSTAGE_TRANSACTION_TIMEOUT_MS": "500",
      "TXSTAGE_OUTPUT_TOPIC": "in-b"},
     ["TXSTAGE_COMMIT_INTERVAL_MS: Input should be a valid integer, unable to parse string "
      "as an integer", "TXSTAGE_OUTPUT_TOPIC must not be one of the input topics"]),
    ({"TXSTAGE_INPUT_TOPICS": "", "TXSTAGE_DLQ_TOPIC": "out", "TXSTAGE_GROUP_PROTOCOL": "consumer",
      "TXSTAGE_KAFKA__SESSION_TIMEOUT_MS": "10000"},
     ["TXSTAGE_INPUT_TOPICS: name at least one input topic",
      "TXSTAGE_KAFKA__session.timeout.ms cannot be set with TXSTAGE_GROUP_PROTOCOL=consumer: "
      "the session timeout is the broker's group.consumer.session.timeout.ms"]),
])
def test_checks_across_settings_run_except_those_involving_a_bad_value(
        env: dict[str, str], expected: list[str]) -> None:
    assert problems_of({**BASE, **env}) == expected


# --- a missing setting whose name was mistyped -----------------------------------------


@pytest.mark.parametrize(("missing", "typo"), [
    ("TXSTAGE_BOOTSTRAP_SERVERS", "TXSTAGE_BOOTSTRAP_SERVER"),
    ("TXSTAGE_INPUT_TOPICS", "TXSTAGE_INPUT_TOPIC"),
    ("TXSTAGE_GROUP_ID", "txstage_groupid"),
])
def test_a_missing_required_setting_names_the_close_variable_that_is_set(
        missing: str, typo: str) -> None:
    env = {k: v for k, v in BASE.items() if k != missing}
    assert problems_of({**env, typo: BASE[missing]}) == [
        f"{typo}: not a setting (did you mean {missing}?)",
        f"{missing}: Field required ({typo} is set: a typo?)",
    ]


# --- what librdkafka refuses, under the name the user set ------------------------------


@pytest.mark.parametrize(("env", "expected"), [
    ({"TXSTAGE_PRODUCER__LINGER_MS": "banana"},
     ['TXSTAGE_PRODUCER__LINGER_MS=banana: librdkafka refuses the pinned producer '
      'configuration: Invalid value for configuration property "queue.buffering.max.ms" '
      "(librdkafka's name for linger.ms)"]),
    ({"TXSTAGE_PRODUCER__linger.ms": "banana"},  # as spelled
     ['TXSTAGE_PRODUCER__linger.ms=banana: librdkafka refuses the pinned producer '
      'configuration: Invalid value for configuration property "queue.buffering.max.ms" '
      "(librdkafka's name for linger.ms)"]),
    ({"TXSTAGE_KAFKA__LINGER_MS": "banana"},  # both clients, one line
     ['TXSTAGE_KAFKA__LINGER_MS=banana: librdkafka refuses the pinned producer and consumer '
      'configurations: Invalid value for configuration property "queue.buffering.max.ms" '
      "(librdkafka's name for linger.ms)"]),
    ({"TXSTAGE_CONSUMER__FETCH_MAX_BYTES": "lots", "TXSTAGE_CONSUMER__CHECK_CRCS": "true"},
     ['TXSTAGE_CONSUMER__FETCH_MAX_BYTES=lots: librdkafka refuses the consumer '
      'configuration: Invalid value for configuration property "fetch.max.bytes"']),
    ({"TXSTAGE_PRODUCER__MESSAGE_TIMEOUT_MS": "120000",
      "TXSTAGE_PRODUCER__COMPRESSION_TYPE": "lz4"},
     ["TXSTAGE_PRODUCER__MESSAGE_TIMEOUT_MS=120000: librdkafka refuses the pinned producer "
      "configuration: Failed to create producer: `message.timeout.ms` must be set <= "
      "`transaction.timeout.ms`"]),
    ({"TXSTAGE_PRODUCER__LINGER_MS": "banana", "TXSTAGE_PRODUCER__BATCH_SIZE": "lots"},
     ['TXSTAGE_PRODUCER__LINGER_MS=banana: librdkafka refuses the pinned producer '
      'configuration: Invalid value for configuration property "queue.buffering.max.ms" '
      "(librdkafka's name for linger.ms)",
      "TXSTAGE_PRODUCER__BATCH_SIZE=lots: librdkafka refuses the pinned producer "
      'configuration: Invalid value for configuration property "batch.size"']),
])
def test_a_refused_pass_through_is_named_by_the_variable_the_user_set(
        env: dict[str, str], expected: list[str]) -> None:
    assert refused_configs(load_settings({**BASE, **env})) == expected


def test_a_refused_pass_through_from_a_file_or_named_like_a_secret_hides_its_value(
        tmp_path: Path) -> None:
    linger = tmp_path / "linger"
    linger.write_text("banana\n")
    problems = refused_configs(load_settings({
        **BASE, "TXSTAGE_PRODUCER_FILE__LINGER_MS": str(linger),
        "TXSTAGE_KAFKA__SSL_KEY_PASSWORDS": "hunter2"}))
    assert problems == [
        "TXSTAGE_KAFKA__SSL_KEY_PASSWORDS: librdkafka refuses the pinned producer and "
        'consumer configurations: No such configuration property: "ssl.key.passwords"',
        "TXSTAGE_PRODUCER_FILE__LINGER_MS: librdkafka refuses the pinned producer "
        'configuration: Invalid value for configuration property "queue.buffering.max.ms" '
        "(librdkafka's name for linger.ms)",
    ]
