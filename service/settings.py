"""The one frozen settings object, read from ``TXSTAGE_*`` environment variables or ``.env``.

librdkafka properties pass through as ``TXSTAGE_KAFKA__<property>`` (both clients),
``TXSTAGE_CONSUMER__<property>`` or ``TXSTAGE_PRODUCER__<property>``; underscores
in the property part stand for dots, so ``TXSTAGE_KAFKA__SASL_PASSWORD`` is
``sasl.password``. Pass-through values are secrets: never logged (kafka.config shows
one librdkafka refuses unless it is named like a secret or read from a file).
``TXSTAGE_KAFKA_FILE__<property>`` (and ``TXSTAGE_CONSUMER_FILE__``,
``TXSTAGE_PRODUCER_FILE__``) names a file holding the value instead, e.g. a mounted
Secret: ``TXSTAGE_KAFKA_FILE__SASL_PASSWORD=/run/secrets/kafka-password``.
Any other ``TXSTAGE_*`` name is an error, with a did-you-mean, unless in NOT_SETTINGS;
load_settings reports every problem at once, one line each.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Literal, Self

from dotenv import dotenv_values
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.bootstrap_servers import bootstrap_problem
from service.errors import ConfigError
from service.format_settings import FormatSettings
from service.passthrough import OFFSET_RESETS, PASSTHROUGH_PREFIXES, passthrough_problems

Guarantee = Literal["exactly_once", "at_least_once"]
Transactions = Literal["per_partition", "spanning"]
GroupProtocol = Literal["classic", "consumer"]
FILE_SUFFIX = "_FILE__"  # TXSTAGE_KAFKA_FILE__<property>: the value is in that file

# Not settings, yet set where stages run (a shell, `make test`, the test suite, whose
# replicas inherit its environment), so allowed; who reads each (docs/operations.md):
NOT_SETTINGS = {
    "TXSTAGE_CACHE_DIR": "service/local_kafka/cache.py, deploy/tools/promtool.sh, deploy/images/",
    "TXSTAGE_SPARK_LOG_LEVEL": "service/backfill/session.py (Spark's log level)",
    "TXSTAGE_EXAMPLE_SUMMARY_TOPIC": "service/examples/fanout.py (an example transform)",
    "TXSTAGE_PROMTOOL": "tests/unit/test_deploy_files.py (the Makefile sets it)",
    "TXSTAGE_IMAGE_TAG": "tests/image/conftest.py (the image under test)",
    "TXSTAGE_TEST_BOOTSTRAP": "tests/conftest.py (a broker the suite did not start)",
    "TXSTAGE_TEST_STAGE_TREE": "tests/harness/replica.py (the tree replicas run from)",
    "TXSTAGE_TEST_DURATIONS": "tests/harness/durations.py (where test durations go)",
    "TXSTAGE_TEST_BASE": "deploy/images/test-base.sh (the test base image's tag)",
}
NOT_SETTING_PREFIXES = ("TXSTAGE_TEST_", "TXSTAGE_SPARK_", "TXSTAGE_EXAMPLE_")  # later knobs

def _split(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


# The fields whose values stand in for ones that failed (load_settings' second pass): a
# default standing in for a bad value could make a false timing conflict.
_FAILED: ContextVar[frozenset[str]] = ContextVar("_FAILED", default=frozenset())


class Settings(FormatSettings, BaseSettings):
    """Everything a replica needs; docs/settings.md describes each one."""

    model_config = SettingsConfigDict(
        env_prefix="TXSTAGE_", env_file=".env", extra="ignore", frozen=True,
        case_sensitive=False,
    )

    bootstrap_servers: str
    group_id: str
    input_topics: Annotated[tuple[str, ...], NoDecode]
    output_topic: str
    transform: str
    guarantee: Guarantee = "exactly_once"
    transactions: Transactions = "per_partition"
    group_protocol: GroupProtocol = "classic"
    commit_interval_ms: int = Field(100, gt=0)
    commit_max_records: int = Field(5000, gt=0)
    max_transactions_per_s: float = Field(0.0, ge=0)  # the replica's; 0: no budget
    dlq_topic: str = ""
    transactional_id_prefix: str = ""
    transaction_timeout_ms: int = Field(60_000, gt=0)
    batch_size: int = Field(500, gt=0, le=100_000)
    # Records consumed but not processed yet (a partition committing, or a batch handed
    # back at the poll-gap bound), in bytes: per replica, and per partition.
    held_max_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024)
    held_partition_max_bytes: int = Field(16 * 1024 * 1024, ge=1024 * 1024)
    poll_timeout_ms: int = Field(100, gt=0)
    max_record_attempts: int = Field(5, gt=0)
    workers: int = Field(0, ge=0, le=64)  # 0: the transform runs in the stage's process
    transform_timeout_ms: int = Field(60_000, ge=0)  # 0: a transform call runs unwatched
    retry_backoff_ms: int = Field(200, ge=0)
    shutdown_timeout_s: float = Field(25.0, gt=0)
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(9108, ge=0, le=65535)
    health_stale_after_s: float = Field(30.0, gt=0)
    lso_check_interval_s: float = Field(10.0, ge=0)  # 0: no last-stable-offset watch
    group_lag_interval_s: float = Field(5.0, ge=0)  # 0: no txstage_group_lag
    fetch_stall_s: float = Field(30.0, ge=0)  # 0: no watch for unfetched partitions
    statistics_interval_ms: int = Field(10_000, ge=0)  # 0: no librdkafka statistics
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    kafka: dict[str, SecretStr] = Field(default_factory=dict)
    consumer: dict[str, SecretStr] = Field(default_factory=dict)
    producer: dict[str, SecretStr] = Field(default_factory=dict)
    # (section, property) -> the variable that set it, as spelled (load_settings)
    _variables: dict[tuple[str, str], str] = {}  # a private attribute: copied per instance

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        if (problem := bootstrap_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("input_topics", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return _split(value)

    @field_validator("input_topics")
    @classmethod
    def _at_least_one_topic(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("name at least one input topic")
        return value

    @field_validator("group_protocol", "guarantee", "transactions", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower().strip() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        failed = _FAILED.get()
        timed = not failed & {"guarantee", "commit_interval_ms", "transaction_timeout_ms",
                              "transform_timeout_ms"}
        problems = [*passthrough_problems(self.kafka, self.consumer, self.producer,
                                          self.group_protocol),
                    *(self._timing_problems() if timed else []), *self._format_problems()]
        # Topics that failed are stand-ins, all spelt alike: they conflict with nothing.
        inputs = () if "input_topics" in failed else self.input_topics
        if self.dlq_topic and "dlq_topic" not in failed and self.dlq_topic in inputs:
            problems.append("TXSTAGE_DLQ_TOPIC must not be one of the input topics")
        if "output_topic" not in failed and self.output_topic in inputs:
            problems.append("TXSTAGE_OUTPUT_TOPIC must not be one of the input topics")
        if self.spanning and not self.exactly_once:  # at-least-once has no transactions
            problems.append("TXSTAGE_TRANSACTIONS=spanning needs TXSTAGE_GUARANTEE=exactly_once")
        if self.workers and self.formatted:  # the codecs live in the main process only
            problems.append(f"TXSTAGE_WORKERS={self.workers} runs only a bytes transform: "
                            "set the formats to bytes or TXSTAGE_WORKERS=0")
        if problems:
            raise ValueError("\n".join(problems))  # one line each (load_settings)
        return self

    @property
    def starts_at_end(self) -> bool:
        """A partition with no committed offset starts at the end of its log
        (``auto.offset.reset`` latest); the default is its beginning. (The consumer
        section wins over the kafka one, as in ``kafka_config.consumer_config``.)"""
        value = self.consumer.get("auto.offset.reset") or self.kafka.get("auto.offset.reset")
        return value is not None and OFFSET_RESETS.get(value.get_secret_value(), False)

    def _timing_problems(self) -> list[str]:
        # A transaction stays open an interval: room before the coordinator times it out.
        found = [f"TXSTAGE_COMMIT_INTERVAL_MS={self.commit_interval_ms} must be at most a "
                 f"tenth of TXSTAGE_TRANSACTION_TIMEOUT_MS={self.transaction_timeout_ms}"] if \
            self.exactly_once and self.commit_interval_ms * 10 > self.transaction_timeout_ms else []
        # Past max.poll.interval.ms the partitions move before an overrun is recorded.
        poll = self.consumer.get("max.poll.interval.ms") or self.kafka.get("max.poll.interval.ms")
        poll_ms = poll.get_secret_value().strip() if poll is not None else "300000"
        if poll_ms.isdigit() and self.transform_timeout_ms >= int(poll_ms) and \
                "transform_timeout_ms" in self.model_fields_set:
            found.append(f"TXSTAGE_TRANSFORM_TIMEOUT_MS={self.transform_timeout_ms} must be "
                         f"below the consumer's max.poll.interval.ms ({poll_ms}), or 0 (off)")
        return found

    def passthrough_variable(self, section: str, prop: str) -> str:
        """The variable that set pass-through ``prop`` of ``section``, as spelled."""
        return self._variables.get((section, prop)) or \
            PASSTHROUGH_PREFIXES[section] + prop.upper().replace(".", "_")

    @property
    def call_deadline_s(self) -> float:
        """How long a Kafka call of a commit, an abort or a lookup is retried: the
        transaction time-out (the coordinator decides within it) and 30 s more, the
        Java client's request time-out, for its answer to arrive."""
        return self.transaction_timeout_ms / 1000 + 30

    @property
    def id_prefix(self) -> str:
        return self.transactional_id_prefix or self.group_id

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == "exactly_once"

    @property
    def spanning(self) -> bool:
        return self.transactions == "spanning"

    def transactional_id(self, topic: str, partition: int) -> str:
        """The id that always stands for this input partition, so that the next owner's
        init_transactions fences the last one (docs/decisions.md)."""
        return f"{self.id_prefix}.{topic}.{partition}"


def _passthrough(environ: Mapping[str, str]
                 ) -> tuple[dict[str, dict[str, str]], dict[tuple[str, str], str], list[str]]:
    """``TXSTAGE_KAFKA__SASL_PASSWORD`` → ``{"kafka": {"sasl.password": ...}}``; a
    ``TXSTAGE_KAFKA_FILE__SASL_PASSWORD`` names a file holding the value (one trailing
    newline dropped). Also the variable that set each property, and a problem naming
    the variable for each file that cannot be read."""
    found: dict[str, dict[str, str]] = {section: {} for section in PASSTHROUGH_PREFIXES}
    variables: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    for name, value in environ.items():
        for section, prefix in PASSTHROUGH_PREFIXES.items():
            for start in (prefix, prefix.removesuffix("__") + FILE_SUFFIX):
                if not name.upper().startswith(start) or len(name) == len(start):
                    continue
                try:
                    text = value if start == prefix else Path(value).read_text().removesuffix("\n")
                except OSError as exc:
                    problems.append(f"{name}: cannot read {value}: {exc.strerror or exc}")
                    continue
                found[section][prop := _property(name[len(start):])] = text
                variables[section, prop] = name
    return found, variables, problems


def _property(part: str) -> str:
    return part.lower().replace("_", ".")


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings (``environ``, or the environment over ``.env``);
    every problem, all at once, becomes one line of a ConfigError."""
    env = environment() if environ is None else dict(environ)
    unknown = unknown_names(env)
    passthrough, variables, problems = _passthrough(env)
    problems = [_unknown_problem(name, hint) for name, hint in unknown.items()] + problems
    values = {name[len(ENV_PREFIX):].lower(): value for name, value in env.items()
              if name.upper() in SETTING_NAMES}
    given = {**values, **passthrough}
    try:
        settings = Settings(_env_file=None, **given)  # type: ignore[arg-type, call-arg]
    except ValidationError as exc:
        problems += _validation_problems(exc, given, unknown)
    else:
        if not problems:
            settings._variables = variables
            return settings
    raise ConfigError(*problems)


def environment(cwd: Path | None = None) -> dict[str, str]:
    """``os.environ`` over ``.env``: what the stage and the backfill read settings from."""
    dotenv = (cwd or Path.cwd()) / ".env"
    found = dotenv_values(dotenv) if dotenv.is_file() else {}
    return {**{k: v for k, v in found.items() if v is not None}, **os.environ}


ENV_PREFIX = "TXSTAGE_"
# TXSTAGE_<FIELD> for each setting; the pass-through dicts are set by families instead.
SETTING_NAMES = tuple(ENV_PREFIX + field.upper() for field in Settings.model_fields
                      if field not in PASSTHROUGH_PREFIXES)
_FAMILIES = tuple(prefix for p in PASSTHROUGH_PREFIXES.values()
                  for prefix in (p.removesuffix("__") + FILE_SUFFIX, p))  # _FILE__ first


def is_allowed_name(name: str) -> bool:
    """A setting, a pass-through property (``TXSTAGE_KAFKA__<property>``...) or allowed."""
    upper = name.upper()
    return (upper in SETTING_NAMES or upper in NOT_SETTINGS
            or upper.startswith(NOT_SETTING_PREFIXES)
            or any(upper.startswith(f) and len(upper) > len(f) for f in _FAMILIES))


def unknown_names(env: Mapping[str, str]) -> dict[str, str | None]:
    """The ``TXSTAGE_*`` names of ``env`` that are not allowed -> what each may mean."""
    return {name: _did_you_mean(name) for name in sorted(env)
            if name.upper().startswith(ENV_PREFIX) and not is_allowed_name(name)}


def _did_you_mean(name: str) -> str | None:
    upper = name.upper()
    candidates = [n[len(ENV_PREFIX):] for n in (*SETTING_NAMES, *NOT_SETTINGS)]
    if close := difflib.get_close_matches(upper[len(ENV_PREFIX):], candidates, 1, 0.7):
        return ENV_PREFIX + close[0]
    # A pass-through family misspelt: TXSTAGE_PRODUCERS__LINGER_MS, TXSTAGE_KAFKA_SASL_...
    heads = [family.removesuffix("__") for family in _FAMILIES]
    head, sep, rest = upper.partition("__")
    if not sep:  # one underscore short
        head = next((h for h in heads if upper.startswith(h + "_")), "")
        rest = upper[len(head) + 1:] if head else ""
    family = difflib.get_close_matches(head, heads, 1, 0.8) if rest else []
    return f"{family[0]}__{name[len(name) - len(rest):]}" if family else None


def _unknown_problem(name: str, hint: str | None) -> str:
    upper = name.upper()
    if upper in _FAMILIES:
        return f"{name}: names no librdkafka property (set {upper}<property>)"
    if upper + "__" in _FAMILIES:
        return (f"{name}: not a setting (librdkafka properties are set one by one, as "
                f"{upper}__<property>)")
    return f"{name}: not a setting" + (f" (did you mean {hint}?)" if hint else "")


def _validation_problems(exc: ValidationError, given: Mapping[str, object],
                         unknown: Mapping[str, str | None]) -> list[str]:
    """One line per error, and the checks across fields, which failed fields stop: run
    again with stand-ins for those (skipping the timing check they could upset)."""
    errors = list(exc.errors())
    if failed := {str(error["loc"][0]) for error in errors if error["loc"]}:
        fields = Settings.model_fields
        stand_ins = {name: "stand-in:9092" if fields[name].is_required()
                     else fields[name].get_default(call_default_factory=True) for name in failed}
        token = _FAILED.set(frozenset(failed))
        try:
            Settings(_env_file=None, **{**given, **stand_ins})  # type: ignore[arg-type, call-arg]
        except ValidationError as again:
            errors += [error for error in again.errors() if not error["loc"]]
        finally:
            _FAILED.reset(token)
    return [line for error in errors for line in _describe(error, unknown).split("\n")]


def _describe(error: Mapping[str, object], unknown: Mapping[str, str | None]) -> str:
    loc = error.get("loc") or ()
    field = str(loc[0]) if isinstance(loc, tuple) and loc else ""
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if not field:
        return message
    name = ENV_PREFIX + field.upper()
    typos = [typo for typo, hint in unknown.items() if hint == name]
    if error.get("type") == "missing" and typos:
        message += f" ({', '.join(typos)} {'is' if len(typos) == 1 else 'are'} set: a typo?)"
    return f"{name}: {message}"
