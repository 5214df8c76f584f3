"""A backfill sizes its producers and output checks as the stage does, from the topics
it writes: a Kafka sink's default output and dead-letter topics after the topic map
(never the stage's live topics it does not write); a Parquet sink only by a size the
user set."""

from __future__ import annotations

import pytest

from service.backfill import tasks
from service.backfill.config import Flags, JobConfig, build
from service.backfill.specs import parse_sink, parse_source

ENV = {"TXSTAGE_BOOTSTRAP_SERVERS": "b:9092", "TXSTAGE_TRANSFORM": "service.examples.square:square",
       "TXSTAGE_OUTPUT_TOPIC": "squares", "TXSTAGE_DLQ_TOPIC": "squares-dlq"}
LIMITS = {"squares": 9_000_000, "squares-dlq": 9_000_000,  # the stage's live topics
          "squares-v2": 1_048_588, "squares-dlq-v2": 2_000_000}


class _Cluster:
    def __init__(self, _config: object) -> None:
        pass

    def topic_config(self, topic: str) -> dict[str, str]:
        return {"max.message.bytes": str(LIMITS[topic])}


@pytest.fixture(autouse=True)
def cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "Cluster", _Cluster)
    monkeypatch.setattr(tasks, "_limits", {})


def _config(source: str = "kafka://numbers", sink: str = "kafka", **env: str) -> JobConfig:
    return build(Flags(parse_source(source), parse_sink(sink), topic_suffix="-v2"),
                 {**ENV, **env})


def test_a_kafka_sink_is_sized_from_its_mapped_output_and_dead_letter_topics() -> None:
    config = _config()
    assert (config.output_topic, config.dlq_topic) == ("squares-v2", "squares-dlq-v2")
    assert tasks.max_bytes(config.settings, kafka_sink=True) == 2_000_000


def test_a_size_the_user_set_wins() -> None:
    config = _config(TXSTAGE_PRODUCER__MESSAGE_MAX_BYTES="1500000")
    assert tasks.max_bytes(config.settings, kafka_sink=True) == 1_500_000


def test_each_output_is_checked_against_its_topic_and_the_jobs_size() -> None:
    config = _config()
    size = tasks.max_bytes(config.settings, kafka_sink=True)
    spec = tasks.Processing(config.transform, config.output_topic, config.dlq_topic, size,
                            config.settings, config.topics)
    assert tasks._max_bytes(spec)("squares-v2") == 1_048_588  # min(size, the topic's)
    assert tasks._max_bytes(spec)("squares-dlq-v2") == 2_000_000
    smaller = tasks.Processing(config.transform, config.output_topic, config.dlq_topic,
                               1_000_000, config.settings, config.topics)
    assert tasks._max_bytes(smaller)("squares-dlq-v2") == 1_000_000  # not the first job's


def test_a_parquet_sink_checks_no_size_unless_the_user_set_one() -> None:
    assert tasks.max_bytes(_config(sink="parquet:///tmp/x").settings,
                           kafka_sink=False) == tasks.UNLIMITED
    told = _config(sink="parquet:///tmp/x", TXSTAGE_KAFKA__MESSAGE_MAX_BYTES="1500000")
    assert tasks.max_bytes(told.settings, kafka_sink=False) == 1_500_000
    files = _config(source="parquet:///lake/x", sink="parquet:///tmp/x")
    assert files.settings is None
    assert tasks.max_bytes(files.settings, kafka_sink=False) == tasks.UNLIMITED
