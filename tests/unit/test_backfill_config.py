"""Flags over TXSTAGE_* settings: the stage's Settings, with the job's derived fields."""

from __future__ import annotations

from service.backfill.config import Flags, build
from service.backfill.specs import parse_sink, parse_source

ENV = {"TXSTAGE_BOOTSTRAP_SERVERS": "b:9092", "TXSTAGE_TRANSFORM": "service.examples.square:square",
       "TXSTAGE_OUTPUT_TOPIC": "squares", "TXSTAGE_GROUP_ID": "orders-stage"}


def flags(source: str = "kafka://numbers", sink: str = "kafka", **kw: object) -> Flags:
    return Flags(parse_source(source), parse_sink(sink), **kw)  # type: ignore[arg-type]


def test_the_stage_settings_are_reused_with_job_derived_fields() -> None:
    config = build(flags(), ENV)
    settings = config.kafka()
    assert settings.bootstrap_servers == "b:9092"
    assert settings.group_id == f"orders-stage.backfill.{config.job_id}"
    assert settings.input_topics == ("numbers",)
    assert config.id_prefix == "orders-stage"
    assert config.progress_topic == "orders-stage.backfill.progress"


def test_flags_override_the_environment() -> None:
    config = build(flags(sink="kafka://other", transform="service.examples.enrich:enrich",
                         transactional_id_prefix="bf", dlq_topic="dead"), ENV)
    assert (config.output_topic, config.transform, config.dlq_topic, config.id_prefix) == \
        ("other", "service.examples.enrich:enrich", "dead", "bf")
    assert config.definition["transform"] == "service.examples.enrich:enrich"


def test_both_spellings_of_the_output_topic_are_the_same_job() -> None:
    a = build(flags(sink="kafka://squares"), {**ENV, "TXSTAGE_OUTPUT_TOPIC": "x"})
    b = build(flags(output_topic="squares"), ENV)
    assert a.job_id == b.job_id


def test_the_job_id_follows_the_arguments_unless_given() -> None:
    assert build(flags(), ENV).job_id == build(flags(), ENV).job_id
    assert build(flags(), ENV).job_id != build(flags(slice_records=10), ENV).job_id
    assert build(flags(job_id="nightly-1"), ENV).job_id == "nightly-1"


def test_files_to_parquet_need_no_kafka() -> None:
    env = {k: v for k, v in ENV.items() if k != "TXSTAGE_BOOTSTRAP_SERVERS"}
    assert build(flags("jsonl:///in", "parquet:///out"), env).settings is None


