"""Input DataFrames, all in rows.INPUT_DDL's shape, one Spark partition per slice or more.

Kafka: one read per slice (Spark's Kafka batch source, read_committed, headers
included), unioned in plan order: a slice is exactly one Spark partition, read in offset
order. Files: Parquet or JSON lines with the fields of service.Record; the plan counts
them per chunk, then each row is tagged with its slice, rows are hash-partitioned by
slice (a slice never spans two tasks) and sorted by offset within each partition.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from service.backfill.plan import PartitionRange, Slice
from service.backfill.specs import FileSource
from service.errors import ConfigError
from service.settings import Settings

REQUIRED = ("topic", "partition", "offset", "timestamp", "value")
OPTIONAL = ("key", "headers")
HEADERS_TYPE = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                         T.StructField("value", T.BinaryType())]))


# librdkafka property → Spark's Kafka source option (Java client) for what maps one to one.
_SAME_MEANING = {"security.protocol": "security.protocol", "sasl.mechanism": "sasl.mechanism",
                 "sasl.mechanisms": "sasl.mechanism", "client.rack": "client.rack"}
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def kafka_reader_options(settings: Settings, extra: Mapping[str, str]) -> dict[str, str]:
    """Options of Spark's Kafka source (a Java consumer) from the stage's librdkafka
    settings: bootstrap, security protocol, SASL PLAIN/SCRAM credentials and a PEM CA
    translate; anything else is passed with ``--reader-option <java property>=<value>``."""
    props = {name: value.get_secret_value()
             for name, value in {**settings.kafka, **settings.consumer}.items()}
    options = {
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        # The range is bounded and already written: a fetch with nothing to return (the
        # end of a slice) would otherwise idle 500 ms per task. Halves a warm 100k read.
        "kafka.fetch.max.wait.ms": "10",
    }
    options |= {f"kafka.{java}": props[name] for name, java in _SAME_MEANING.items()
                if name in props}
    mechanism = options.get("kafka.sasl.mechanism", "").upper()
    if "sasl.username" in props and mechanism in _LOGIN_MODULES:
        options["kafka.sasl.jaas.config"] = (
            f'{_LOGIN_MODULES[mechanism]} required username="{props["sasl.username"]}" '
            f'password="{props.get("sasl.password", "")}";')
    if "ssl.ca.location" in props:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = props["ssl.ca.location"]
    options |= {f"kafka.{name}": value for name, value in extra.items()}
    return options


def kafka_slices(spark: SparkSession, options: Mapping[str, str],
                 slices: Sequence[tuple[Slice, int]]) -> DataFrame:
    """Union of one read per (slice, first offset to read); plan order is partition order."""
    frames = [_kafka_range(spark, options, piece, start).withColumn("slice", F.lit(piece.index))
              for piece, start in slices]
    union = functools.reduce(DataFrame.union, frames)
    return union.select("slice", "topic", "partition", "offset",
                        F.unix_millis("timestamp").alias("timestamp"),
                        "key", "value", "headers")


def _kafka_range(spark: SparkSession, options: Mapping[str, str], piece: Slice,
                 start: int) -> DataFrame:
    topic, partition = piece.topic, str(piece.partition)
    return (spark.read.format("kafka")
            .options(**options)
            .option("assign", json.dumps({topic: [piece.partition]}))
            .option("startingOffsets", json.dumps({topic: {partition: start}}))
            .option("endingOffsets", json.dumps({topic: {partition: piece.end}}))
            .option("kafka.isolation.level", "read_committed")
            .option("includeHeaders", "true")
            .load())


def files(spark: SparkSession, source: FileSource) -> DataFrame:
    """The file source as rows of INPUT_DDL without the slice column."""
    if source.format == "parquet":
        raw = spark.read.parquet(source.path)
    else:
        raw = spark.read.json(source.path)
    return normalise(raw, source)


def normalise(raw: DataFrame, source: FileSource) -> DataFrame:
    fields = {f.name: f.dataType for f in raw.schema.fields}
    missing = [name for name in REQUIRED if name not in fields]
    if missing:
        raise ConfigError(f"source {source}: missing field(s) {', '.join(missing)}; the files "
                          f"need {', '.join(REQUIRED)} and may have {', '.join(OPTIONAL)}")
    decode = functools.partial(_bytes, source=source)
    key = decode(F.col("key"), fields["key"]) if "key" in fields \
        else F.lit(None).cast("binary")
    headers = _headers(fields.get("headers"), source)
    return raw.select(
        F.col("topic").cast("string").alias("topic"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        _millis(F.col("timestamp"), fields["timestamp"]).alias("timestamp"),
        key.alias("key"),
        decode(F.col("value"), fields["value"]).alias("value"),
        headers.alias("headers"),
    )


def _bytes(column: Column, kind: T.DataType, source: FileSource) -> Column:
    if isinstance(kind, T.BinaryType):
        return column
    if source.encoding == "base64":
        return F.unbase64(column)
    return F.encode(column, "UTF-8")


def _millis(column: Column, kind: T.DataType) -> Column:
    if isinstance(kind, T.TimestampType | T.TimestampNTZType):
        return F.unix_millis(column)
    return column.cast("long")


def _headers(kind: T.DataType | None, source: FileSource) -> Column:
    if kind is None:
        return F.lit(None).cast(HEADERS_TYPE)
    if not (isinstance(kind, T.ArrayType) and isinstance(kind.elementType, T.StructType)):
        raise ConfigError(f"source {source}: headers must be a list of {{key, value}}")
    value_type = kind.elementType["value"].dataType
    return F.transform("headers", lambda h: F.struct(
        h["key"].cast("string").alias("key"),
        _bytes(h["value"], value_type, source).alias("value")))


def file_ranges(frame: DataFrame, slice_records: int) -> list[PartitionRange]:
    """Count the rows per (topic, partition, chunk): the file source's plan (one Spark job).

    Raises ConfigError when an offset appears twice: its outputs would be written twice.
    """
    chunk = F.floor(F.col("offset") / F.lit(slice_records))
    counted = (frame.groupBy("topic", "partition", chunk.alias("chunk"))
               .agg(F.min("offset").alias("first"), F.max("offset").alias("last"),
                    F.count(F.lit(1)).alias("records"),
                    F.count_distinct("offset").alias("distinct"))
               .collect())
    incomplete = sum(r["records"] for r in counted
                     if None in (r["topic"], r["partition"], r["chunk"]))
    if incomplete:
        raise ConfigError(f"{incomplete} input rows have no topic, partition or offset")
    duplicated = [f"{r['topic']}/{r['partition']} (offsets {r['first']}..{r['last']}: "
                  f"{r['records'] - r['distinct']} duplicates)"
                  for r in counted if r["records"] != r["distinct"]]
    if duplicated:
        raise ConfigError("the input files hold the same (topic, partition, offset) more than "
                          "once: " + "; ".join(sorted(duplicated)[:5]))
    return [PartitionRange(r["topic"], r["partition"], r["first"], r["last"] + 1, r["records"])
            for r in counted]


def tag_slices(spark: SparkSession, frame: DataFrame, slices: Sequence[Slice],
               slice_records: int) -> DataFrame:
    """Each row with its slice index, one slice per task, in offset order within a slice."""
    lookup = spark.createDataFrame(
        [(s.topic, s.partition, s.start // slice_records, s.index) for s in slices],
        "topic string, partition int, chunk long, slice int")
    chunk = F.floor(F.col("offset") / F.lit(slice_records)).alias("chunk")
    tagged = (frame.select("*", chunk)
              .join(F.broadcast(lookup), ["topic", "partition", "chunk"], "inner"))
    return (tagged.repartition(max(1, len(slices)), "slice")
            .sortWithinPartitions("slice", "offset")
            .select("slice", "topic", "partition", "offset", "timestamp", "key", "value",
                    "headers"))
