"""One backfill job's configuration: command-line flags over ``TXSTAGE_*`` settings.

The stage's own Settings object is reused, not copied, so the backfill validates and
builds librdkafka configs exactly like the stage (service.kafka.config, pass-through
``TXSTAGE_KAFKA__*``/``TXSTAGE_PRODUCER__*``, protected properties). Its two
stage-only required fields are derived from the job: ``group_id`` =
``<prefix>.backfill.<job_id>`` (client ids; the progress reader never joins it) and
``input_topics`` = the source topic (only validated: outputs must not go back to it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from service.backfill import plan
from service.backfill.slice_writer import DEFAULT_TRANSACTION_BYTES, DEFAULT_TRANSACTION_RECORDS
from service.backfill.specs import FileSource, KafkaSink, KafkaSource, Sink, Source
from service.backfill.topic_map import TopicMap
from service.errors import ConfigError
from service.settings import Settings, load_settings

DEFAULT_PREFIX = "txstage"


@dataclass(frozen=True, slots=True)
class Flags:
    """What the command line said; ``None`` means "from the environment"."""

    source: Source
    sink: Sink
    job_id: str | None = None
    transform: str | None = None
    output_topic: str | None = None
    dlq_topic: str | None = None
    bootstrap_servers: str | None = None
    transactional_id_prefix: str | None = None
    progress_topic: str | None = None
    slice_records: int = plan.DEFAULT_SLICE_RECORDS
    transaction_records: int = DEFAULT_TRANSACTION_RECORDS
    transaction_ms: int = 2000
    transaction_bytes: int = DEFAULT_TRANSACTION_BYTES
    dry_run: bool = False
    overwrite: bool = False
    master: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    progress_interval_s: float = 10.0
    topic_map: Mapping[str, str] = field(default_factory=dict)  # --topic-map
    topic_suffix: str | None = None  # --topic-suffix


@dataclass(frozen=True, slots=True)
class JobConfig:
    flags: Flags
    job_id: str
    definition: dict[str, str | int | None]  # what the job id stands for
    transform: str
    output_topic: str
    dlq_topic: str | None
    id_prefix: str
    progress_topic: str
    settings: Settings | None  # None when neither source nor sink is Kafka
    topics: TopicMap = field(default_factory=TopicMap)  # where each output topic is written

    @property
    def source(self) -> Source:
        return self.flags.source

    @property
    def sink(self) -> Sink:
        return self.flags.sink

    @property
    def kafka_sink(self) -> bool:
        return isinstance(self.flags.sink, KafkaSink)

    def kafka(self) -> Settings:
        assert self.settings is not None, "a Kafka source or sink has settings"
        return self.settings


def build(flags: Flags, env: Mapping[str, str]) -> JobConfig:
    """Resolve flags against ``env``; ConfigError lists every problem found."""
    sink_topic = flags.sink.topic if isinstance(flags.sink, KafkaSink) else None
    transform = flags.transform or env.get("TXSTAGE_TRANSFORM", "")
    output_topic, dlq, topics, problems = _topics(flags, env, sink_topic)
    # (An output topic refused as the stage's live one is not missing as well.)
    problems = _missing(output_topic, transform, output_known=bool(problems)) + problems
    if flags.output_topic and sink_topic and flags.output_topic != sink_topic:
        problems.append(f"--output-topic {flags.output_topic} and --sink kafka://{sink_topic} "
                        f"disagree; give one of them")
    problems += _limits(flags)
    if problems:
        raise ConfigError(*problems)
    assert output_topic is not None
    definition = _definition(flags, transform, output_topic, dlq or None)
    job_id = plan.check_job_id(flags.job_id or plan.default_job_id(plan.fingerprint(definition)))
    prefix = id_prefix(flags.transactional_id_prefix, env)
    settings = _settings(flags, env, job_id, prefix, transform, output_topic, dlq)
    progress_topic = flags.progress_topic or default_progress_topic(prefix)
    return JobConfig(flags, job_id, definition, transform, output_topic, dlq or None, prefix,
                     progress_topic, settings, topics)


def _topics(flags: Flags, env: Mapping[str, str], sink_topic: str | None
            ) -> tuple[str | None, str, TopicMap, list[str]]:
    """The sink's default output and dead-letter topics and the map of every other topic
    (topic_map.py): a topic taken from the stage's settings is its live one, written
    only where mapped or named."""
    named = dict(flags.topic_map)
    stage_out = env.get("TXSTAGE_OUTPUT_TOPIC") or None
    stage_dlq = env.get("TXSTAGE_DLQ_TOPIC") or None
    kafka = isinstance(flags.sink, KafkaSink)
    problems: list[str] = []
    aliases: dict[str, str] = {}

    def sink_of(what: str, given: str | None, stage: str | None, variable: str,
                flag: str) -> str | None:
        if given is not None:  # named on the command line
            if stage and given and stage != given:
                aliases.setdefault(stage, given)  # Output(topic=<the stage's>) goes there too
            return given
        if stage is None or not kafka:
            return stage
        mapped = named.get(stage) or (stage + flags.topic_suffix if flags.topic_suffix else None)
        if mapped is None:
            problems.append(f"the {what} topic {stage!r} comes from {variable}: it is the "
                            f"stage's live topic; name the backfill's with {flag}, or map it "
                            f"(--topic-map {stage}=<topic> or --topic-suffix <suffix>; "
                            f"--topic-map {stage}={stage} writes into it)")
        return mapped

    output = sink_of("default output", flags.output_topic or sink_topic, stage_out,
                     "TXSTAGE_OUTPUT_TOPIC", "--sink kafka://<topic>")
    dlq = sink_of("dead-letter", flags.dlq_topic, stage_dlq, "TXSTAGE_DLQ_TOPIC",
                  "--dlq-topic <topic>") or ""
    topics = TopicMap({**aliases, **named}, flags.topic_suffix or None,
                      frozenset(t for t in (output, dlq) if t), strict=kafka)
    return output, dlq, topics, problems


def id_prefix(flag: str | None, env: Mapping[str, str]) -> str:
    """The stage's transactional-id prefix, so one ACL prefix covers stage and backfill."""
    return (flag or env.get("TXSTAGE_TRANSACTIONAL_ID_PREFIX") or env.get("TXSTAGE_GROUP_ID")
            or DEFAULT_PREFIX)


def default_progress_topic(prefix: str) -> str:
    return f"{prefix}.backfill.progress"


def reader_settings(env: Mapping[str, str], bootstrap: str) -> Settings:
    """Settings for reading only (``verify --job-id``): bootstrap and pass-through count;
    the stage-only fields get placeholders because nothing here transforms or writes."""
    return load_settings({**env, "TXSTAGE_BOOTSTRAP_SERVERS": bootstrap,
                          "TXSTAGE_GROUP_ID": f"{id_prefix(None, env)}.backfill.verify",
                          "TXSTAGE_INPUT_TOPICS": "<none>", "TXSTAGE_OUTPUT_TOPIC": "<none>.",
                          "TXSTAGE_TRANSFORM": "<none>:<none>", "TXSTAGE_DLQ_TOPIC": ""})


def _missing(output_topic: str | None, transform: str, *, output_known: bool) -> list[str]:
    problems = []
    if not output_topic and not output_known:
        problems.append("no output topic: set TXSTAGE_OUTPUT_TOPIC or pass --output-topic "
                        "(the topic of outputs whose Output.topic is None)")
    if not transform:
        problems.append("no transform: set TXSTAGE_TRANSFORM or pass --transform "
                        "module.path:function")
    return problems


def _limits(flags: Flags) -> list[str]:
    checks = (("--slice-records", flags.slice_records), ("--transaction-records",
              flags.transaction_records), ("--transaction-ms", flags.transaction_ms),
              ("--transaction-bytes", flags.transaction_bytes))
    return [f"{name} must be positive, not {value}" for name, value in checks if value <= 0]


def _definition(flags: Flags, transform: str, output_topic: str,
                dlq: str | None) -> dict[str, str | int | None]:
    sink = "kafka" if isinstance(flags.sink, KafkaSink) else str(flags.sink)
    return {"source": str(flags.source), "sink": sink, "transform": transform,
            "output_topic": output_topic, "dlq_topic": dlq,
            "slice_records": flags.slice_records}


def _uses_kafka(flags: Flags) -> bool:
    return isinstance(flags.source, KafkaSource) or isinstance(flags.sink, KafkaSink)


def _settings(flags: Flags, env: Mapping[str, str], job_id: str, prefix: str, transform: str,
              output_topic: str, dlq: str) -> Settings | None:
    if not _uses_kafka(flags):
        return None
    bootstrap = flags.bootstrap_servers or env.get("TXSTAGE_BOOTSTRAP_SERVERS")
    if not bootstrap:
        raise ConfigError("a Kafka source or sink needs TXSTAGE_BOOTSTRAP_SERVERS or "
                          "--bootstrap-servers")
    source = flags.source
    input_topic = source.topic if isinstance(source, KafkaSource) else _files(source)
    derived = {
        "TXSTAGE_BOOTSTRAP_SERVERS": bootstrap,
        "TXSTAGE_GROUP_ID": f"{prefix}.backfill.{job_id}",
        "TXSTAGE_TRANSACTIONAL_ID_PREFIX": prefix,
        "TXSTAGE_INPUT_TOPICS": input_topic,
        "TXSTAGE_OUTPUT_TOPIC": output_topic,
        "TXSTAGE_TRANSFORM": transform,
        "TXSTAGE_DLQ_TOPIC": dlq,
    }
    settings = load_settings({**env, **derived})
    if flags.transaction_ms * 10 > settings.transaction_timeout_ms:
        raise ConfigError(f"--transaction-ms={flags.transaction_ms} must be at most a tenth of "
                          f"TXSTAGE_TRANSACTION_TIMEOUT_MS={settings.transaction_timeout_ms}")
    return settings


def _files(source: Source) -> str:
    assert isinstance(source, FileSource)
    return f"<{source.format} files>"
