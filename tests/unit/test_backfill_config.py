"""Flags over TXSTAGE_* settings: the stage's Settings, with the job's derived fields."""

from __future__ import annotations

import pytest

from service.backfill.config import Flags, build
from service.backfill.specs import parse_sink, parse_source
from service.backfill.topic_map import UnmappedTopicError
from service.contract.processing import Produced, Result
from service.contract.records import Record
from service.errors import ConfigError

ENV = {"TXSTAGE_BOOTSTRAP_SERVERS": "b:9092", "TXSTAGE_TRANSFORM": "service.examples.square:square",
       "TXSTAGE_OUTPUT_TOPIC": "squares", "TXSTAGE_GROUP_ID": "orders-stage"}


def flags(source: str = "kafka://numbers", sink: str = "kafka://squares-v2",
          **kw: object) -> Flags:
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
    b = build(flags(sink="kafka", output_topic="squares"), ENV)
    assert a.job_id == b.job_id


def test_the_job_id_follows_the_arguments_unless_given() -> None:
    assert build(flags(), ENV).job_id == build(flags(), ENV).job_id
    assert build(flags(), ENV).job_id != build(flags(slice_records=10), ENV).job_id
    assert build(flags(job_id="nightly-1"), ENV).job_id == "nightly-1"


def test_files_to_parquet_need_no_kafka() -> None:
    env = {k: v for k, v in ENV.items() if k != "TXSTAGE_BOOTSTRAP_SERVERS"}
    assert build(flags("jsonl:///in", "parquet:///out"), env).settings is None




# -- topics: a backfill never writes into a live topic unless it is named for it -----------


def test_the_stages_own_output_topic_is_refused_unless_named_or_mapped() -> None:
    with pytest.raises(ConfigError) as refused:
        build(flags(sink="kafka"), {**ENV, "TXSTAGE_DLQ_TOPIC": "dead"})
    problems = "\n".join(refused.value.problems)
    assert "the default output topic 'squares' comes from TXSTAGE_OUTPUT_TOPIC" in problems
    assert "--topic-map squares=<topic>" in problems
    assert "the dead-letter topic 'dead' comes from TXSTAGE_DLQ_TOPIC" in problems
    named = build(flags(sink="kafka", topic_map={"squares": "squares", "dead": "dead-v2"}),
                  {**ENV, "TXSTAGE_DLQ_TOPIC": "dead"})
    assert (named.output_topic, named.dlq_topic) == ("squares", "dead-v2")


def test_a_suffix_maps_every_topic_the_stage_or_the_transform_names() -> None:
    config = build(flags(sink="kafka", topic_suffix="-v2", topic_map={"alerts": "alarms"}),
                   {**ENV, "TXSTAGE_DLQ_TOPIC": "dead"})
    assert (config.output_topic, config.dlq_topic) == ("squares-v2", "dead-v2")
    topics = config.topics
    assert [topics(t) for t in ("squares-v2", "dead-v2", "side", "alerts")] == \
        ["squares-v2", "dead-v2", "side-v2", "alarms"]


def test_a_topic_the_transform_names_is_refused_unless_mapped() -> None:
    config = build(flags(dlq_topic="dead-v2"), {**ENV, "TXSTAGE_DLQ_TOPIC": "dead"})
    topics = config.topics
    assert topics("squares") == "squares-v2", "Output(topic=<the stage's>) goes to the named"
    assert topics("dead") == "dead-v2"
    with pytest.raises(UnmappedTopicError, match="--topic-map side=<sink topic>"):
        topics("side")
    assert topics.how("side") == "NOT MAPPED"
    live = build(flags(topic_map={"side": "side"}), ENV).topics
    assert live("side") == "side" and "(the live topic)" in live.how("side")


def test_mapped_outputs_keep_their_records_and_an_unmapped_one_is_refused() -> None:
    def transform(record: Record) -> Result:  # its input's topic names its second output's
        return Result([Produced("squares-v2", None, b"1", []),
                       Produced(record.topic, None, b"2", [])])

    with pytest.raises(UnmappedTopicError):
        build(flags(), ENV).topics.applied(transform)(Record("side", 0, 0, 0, None, b"x"))
    suffixed = build(flags(topic_suffix="-v2"), ENV).topics.applied(transform)
    assert [o.topic for o in suffixed(Record("side", 0, 0, 0, None, b"x")).outputs] == \
        ["squares-v2", "side-v2"]


def test_a_parquet_sink_keeps_every_topic_as_it_is() -> None:
    config = build(flags("jsonl:///in", "parquet:///out"), ENV)
    assert config.topics("side") == "side" and config.output_topic == "squares"
