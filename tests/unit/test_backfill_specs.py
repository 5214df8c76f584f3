"""Source and sink URIs, parsed without Kafka or Spark."""

import pytest

from service.backfill.specs import (
    Earliest,
    FileSource,
    KafkaSink,
    KafkaSource,
    Latest,
    Offsets,
    ParquetSink,
    Timestamp,
    parse_sink,
    parse_source,
)
from service.errors import ConfigError


def test_kafka_source_defaults_to_the_whole_committed_topic() -> None:
    assert parse_source("kafka://orders") == KafkaSource("orders", Earliest(), Latest())


def test_kafka_source_takes_offsets_and_timestamps() -> None:
    source = parse_source("kafka://orders?from=offsets:0=5,1=7&to=timestamp:1700000000000")
    assert source == KafkaSource("orders", Offsets({0: 5, 1: 7}), Timestamp(1_700_000_000_000))
    assert isinstance(source, KafkaSource)
    assert source.partitions() == {0, 1}


def test_iso_timestamps_need_a_time_zone() -> None:
    source = parse_source("kafka://t?from=timestamp:2024-05-01T00:00:00Z")
    assert source == KafkaSource("t", Timestamp(1_714_521_600_000), Latest())
    with pytest.raises(ConfigError, match="time zone"):
        parse_source("kafka://t?from=timestamp:2024-05-01T00:00:00")


def test_a_source_prints_back_as_it_parses() -> None:
    text = "kafka://orders?from=offsets:0=5,1=7&to=latest"
    assert str(parse_source(text)) == text
    assert parse_source(str(parse_source(text))) == parse_source(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s3://bucket/x", "unknown scheme 's3'"),
        ("orders", "unknown scheme ''"),
        ("kafka://", "the topic is missing"),
        ("kafka://?from=earliest", "the topic is missing"),
        ("kafka:orders", "kafka://<topic>"),
        ("kafka://t?from=offsets:0=9&to=offsets:0=3", "ends at offset 3, before its start 9"),
        ("kafka://t?from=timestamp:20&to=timestamp:10", "before the start timestamp"),
        ("kafka://t?from=latest&to=earliest", "before the start"),
        ("kafka://t?from=offsets:0=1&to=offsets:1=5", "the same partitions"),
        ("kafka://t?from=yesterday", "expected earliest, latest"),
        ("kafka://t?from=offsets:0=x", "is not <partition>=<offset>"),
        ("kafka://t?start=0", "unknown parameter 'start'"),
        ("kafka://t?from=earliest&from=latest", "given twice"),
        ("parquet://host/path", "name a path"),
        ("jsonl:///data?encoding=latin1", "utf8 or base64"),
    ],
)
def test_bad_sources_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_source(text)


def test_file_sources_keep_paths_spark_understands() -> None:
    assert parse_source("parquet:///data/in") == FileSource("parquet", "/data/in")
    assert parse_source("parquet:lake/in") == FileSource("parquet", "lake/in")
    assert parse_source("parquet:s3a://bucket/in") == FileSource("parquet", "s3a://bucket/in")
    assert parse_source("jsonl:///in.jsonl?encoding=base64") == \
        FileSource("jsonl", "/in.jsonl", "base64")


@pytest.mark.parametrize(("text", "sink"), [
    ("kafka", KafkaSink()), ("kafka://", KafkaSink()), ("kafka://out", KafkaSink("out")),
    ("parquet:///tmp/out", ParquetSink("/tmp/out")),
])
def test_sinks(text: str, sink: object) -> None:
    assert parse_sink(text) == sink


@pytest.mark.parametrize("text", ["jsonl:///x", "kafka://out?x=1", "kafka://a/b", "hdfs:/x"])
def test_bad_sinks_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_sink(text)
