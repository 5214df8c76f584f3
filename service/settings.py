"""The one frozen settings object, read from ``TXSTAGE_*`` environment variables or ``.env``.

librdkafka properties pass through as ``TXSTAGE_KAFKA__<property>`` (both clients),
``TXSTAGE_CONSUMER__<property>`` or ``TXSTAGE_PRODUCER__<property>``; underscores
in the property part stand for dots, so ``TXSTAGE_KAFKA__SASL_PASSWORD`` is
``sasl.password``. Pass-through values are secrets: never logged, never shown.
``TXSTAGE_KAFKA_FILE__<property>`` (and ``TXSTAGE_CONSUMER_FILE__``,
``TXSTAGE_PRODUCER_FILE__``) names a file holding the value instead, e.g. a mounted
Secret: ``TXSTAGE_KAFKA_FILE__SASL_PASSWORD=/run/secrets/kafka-password``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, Self

from dotenv import dotenv_values
from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.errors import ConfigError

Guarantee = Literal["exactly_once", "at_least_once"]
GroupProtocol = Literal["classic", "consumer"]
PASSTHROUGH_PREFIXES = {"kafka": "TXSTAGE_KAFKA__", "consumer": "TXSTAGE_CONSUMER__",
                        "producer": "TXSTAGE_PRODUCER__"}
FILE_SUFFIX = "_FILE__"  # TXSTAGE_KAFKA_FILE__<property>: the value is in that file

# Properties txstage sets itself; overriding any would silently void the guarantee.
PROTECTED = {
    "isolation.level": "exactly-once reads only committed input (read_committed)",
    "enable.auto.commit": "offsets are committed only inside transactions",
    "enable.auto.offset.store": "offsets are committed only inside transactions",
    "transactional.id": "derived per input partition as <prefix>.<topic>.<partition>",
    "enable.idempotence": "transactions need the idempotent producer",
    "group.id": "set TXSTAGE_GROUP_ID instead",
    "bootstrap.servers": "set TXSTAGE_BOOTSTRAP_SERVERS instead",
    "partition.assignment.strategy": "the stage relies on cooperative-sticky rebalancing",
    "transaction.timeout.ms": "set TXSTAGE_TRANSACTION_TIMEOUT_MS instead",
    "group.protocol": "set TXSTAGE_GROUP_PROTOCOL=classic|consumer instead",
}

# Consumer properties of the classic protocol only; with the next-generation
# protocol (KIP-848) the broker owns them and librdkafka refuses them.
CLASSIC_ONLY = {
    "session.timeout.ms": "the session timeout is the broker's group.consumer.session.timeout.ms",
    "heartbeat.interval.ms": "the heartbeat interval is the broker's "
                             "group.consumer.heartbeat.interval.ms",
    "group.protocol.type": "it applies to the classic protocol only",
}

# auto.offset.reset: where a partition with no committed offset starts (librdkafka's
# names for each end). The stage seeks there itself (service.stage.loop), so
# "error" (fail the fetch) has nothing to act on and is refused.
OFFSET_RESETS = {"earliest": False, "smallest": False, "beginning": False,
                 "latest": True, "largest": True, "end": True}  # name -> at the end


def _split(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class Settings(BaseSettings):
    """Everything a replica needs; see README.md "Settings" for each one."""

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
    group_protocol: GroupProtocol = "classic"
    commit_interval_ms: int = Field(100, gt=0)
    commit_max_records: int = Field(5000, gt=0)
    dlq_topic: str = ""
    transactional_id_prefix: str = ""
    transaction_timeout_ms: int = Field(60_000, gt=0)
    batch_size: int = Field(500, gt=0, le=100_000)
    poll_timeout_ms: int = Field(100, gt=0)
    max_record_attempts: int = Field(5, gt=0)
    retry_backoff_ms: int = Field(200, ge=0)
    shutdown_timeout_s: float = Field(25.0, gt=0)
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(9108, ge=0, le=65535)
    health_stale_after_s: float = Field(30.0, gt=0)
    lso_check_interval_s: float = Field(10.0, ge=0)  # 0: no last-stable-offset watch
    fetch_stall_s: float = Field(30.0, ge=0)  # 0: no watch for unfetched partitions
    statistics_interval_ms: int = Field(10_000, ge=0)  # 0: no librdkafka statistics
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    kafka: dict[str, SecretStr] = Field(default_factory=dict)
    consumer: dict[str, SecretStr] = Field(default_factory=dict)
    producer: dict[str, SecretStr] = Field(default_factory=dict)

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

    @field_validator("group_protocol", "guarantee", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower().strip() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        problems = [*self._protected_overrides(), *self._timing_problems(),
                    *self._protocol_problems(), *self._reset_problems()]
        if self.dlq_topic and self.dlq_topic in self.input_topics:
            problems.append("TXSTAGE_DLQ_TOPIC must not be one of the input topics")
        if self.output_topic in self.input_topics:
            problems.append("TXSTAGE_OUTPUT_TOPIC must not be one of the input topics")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _protected_overrides(self) -> list[str]:
        found = []
        for section, props in (("kafka", self.kafka), ("consumer", self.consumer),
                               ("producer", self.producer)):
            for prop in props:
                if prop in PROTECTED:
                    found.append(f"{PASSTHROUGH_PREFIXES[section]}{prop} cannot be set: "
                                 f"{PROTECTED[prop]}")
        return found

    def _protocol_problems(self) -> list[str]:
        if self.group_protocol != "consumer":
            return []
        return [f"{PASSTHROUGH_PREFIXES[section]}{prop} cannot be set with "
                f"TXSTAGE_GROUP_PROTOCOL=consumer: {CLASSIC_ONLY[prop]}"
                for section, props in (("kafka", self.kafka), ("consumer", self.consumer))
                for prop in props if prop in CLASSIC_ONLY]

    def _reset_problems(self) -> list[str]:
        return [f"{PASSTHROUGH_PREFIXES[section]}auto.offset.reset={value.get_secret_value()} "
                "cannot be used: a partition with no committed offset starts at "
                "earliest (smallest, beginning) or latest (largest, end)"
                for section, props in (("kafka", self.kafka), ("consumer", self.consumer))
                if (value := props.get("auto.offset.reset")) is not None
                and value.get_secret_value() not in OFFSET_RESETS]

    @property
    def starts_at_end(self) -> bool:
        """A partition with no committed offset starts at the end of its log
        (``auto.offset.reset`` latest); the default is its beginning. (The consumer
        section wins over the kafka one, as in ``kafka_config.consumer_config``.)"""
        value = self.consumer.get("auto.offset.reset") or self.kafka.get("auto.offset.reset")
        return value is not None and OFFSET_RESETS.get(value.get_secret_value(), False)

    def _timing_problems(self) -> list[str]:
        # A transaction stays open about one commit interval; leave the
        # coordinator ample room before it times the transaction out.
        if self.guarantee == "exactly_once" and \
                self.commit_interval_ms * 10 > self.transaction_timeout_ms:
            return [f"TXSTAGE_COMMIT_INTERVAL_MS={self.commit_interval_ms} must be at most a "
                    f"tenth of TXSTAGE_TRANSACTION_TIMEOUT_MS={self.transaction_timeout_ms}"]
        return []

    @property
    def id_prefix(self) -> str:
        return self.transactional_id_prefix or self.group_id

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == "exactly_once"

    def transactional_id(self, topic: str, partition: int) -> str:
        """The id that always stands for this input partition (fixed by DESIGN.md §2)."""
        return f"{self.id_prefix}.{topic}.{partition}"


def _passthrough(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``TXSTAGE_KAFKA__SASL_PASSWORD`` → ``{"kafka": {"sasl.password": ...}}``; a
    ``TXSTAGE_KAFKA_FILE__SASL_PASSWORD`` names a file holding the value (one trailing
    newline dropped). A file that cannot be read is a ConfigError naming the variable."""
    found: dict[str, dict[str, str]] = {section: {} for section in PASSTHROUGH_PREFIXES}
    problems: list[str] = []
    for name, value in environ.items():
        for section, prefix in PASSTHROUGH_PREFIXES.items():
            if name.upper().startswith(prefix) and len(name) > len(prefix):
                found[section][_property(name[len(prefix):])] = value
            file_prefix = prefix.removesuffix("__") + FILE_SUFFIX
            if name.upper().startswith(file_prefix) and len(name) > len(file_prefix):
                try:
                    content = Path(value).read_text().removesuffix("\n")
                except OSError as exc:
                    problems.append(f"{name}: cannot read {value}: {exc.strerror or exc}")
                    continue
                found[section][_property(name[len(file_prefix):])] = content
    if problems:
        raise ConfigError(*problems)
    return found


def _property(part: str) -> str:
    return part.lower().replace("_", ".")


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings; every problem becomes one line of a ConfigError."""
    # The real environment wins over .env, as pydantic-settings does for the rest.
    env = environment() if environ is None else dict(environ)
    scoped = {k: v for k, v in env.items() if not any(
        k.upper().startswith((p, p.removesuffix("__") + FILE_SUFFIX))
        for p in PASSTHROUGH_PREFIXES.values())}
    try:
        if environ is None:
            return Settings(**_passthrough(env))  # type: ignore[arg-type]
        return _from_mapping(scoped, _passthrough(env))
    except ValidationError as exc:
        lines = [line for error in exc.errors() for line in _describe(error).split("; ")]
        raise ConfigError(*lines) from None


def environment(cwd: Path | None = None) -> dict[str, str]:
    """``os.environ`` over ``.env``: what the stage and the backfill read settings from."""
    dotenv = (cwd or Path.cwd()) / ".env"
    found = dotenv_values(dotenv) if dotenv.is_file() else {}
    return {**{k: v for k, v in found.items() if v is not None}, **os.environ}


def _from_mapping(env: Mapping[str, str], passthrough: dict[str, dict[str, str]]) -> Settings:
    values: dict[str, object] = {
        name[len("TXSTAGE_"):].lower(): value for name, value in env.items()
        if name.upper().startswith("TXSTAGE_")
    }
    return Settings(_env_file=None, **values, **passthrough)  # type: ignore[arg-type, call-arg]


def _describe(error: Mapping[str, object]) -> str:
    loc = error.get("loc") or ()
    field = str(loc[0]) if isinstance(loc, tuple) and loc else ""
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if not field:
        return message
    return f"TXSTAGE_{field.upper()}: {message}"
