"""Input DataFrames: what Spark hands the tasks, one Spark partition per slice or more.

Kafka: one row per slice, a Spark partition each; its task reads the slice itself with
librdkafka (tasks.KafkaInput, slice_reader), so no record crosses to the JVM. Files:
Parquet or JSON lines with the fields of service.Record, in rows.INPUT_DDL's shape; the
plan counts them per chunk, then each row is tagged with its slice, rows are
hash-partitioned by slice (a slice never spans two tasks) and sorted by offset within
each partition.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from service.backfill.plan import PartitionRange, Slice
from service.backfill.specs import FileSource
from service.errors import ConfigError

REQUIRED = ("topic", "partition", "offset", "timestamp", "value")
OPTIONAL = ("key", "headers")
HEADERS_TYPE = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                         T.StructField("value", T.BinaryType())]))


def slice_indexes(spark: SparkSession, slices: Sequence[Slice]) -> DataFrame:
    """One row (``slice int``) per slice, each in its own Spark partition, in plan order:
    the task reads the slice itself (tasks.KafkaInput)."""
    indexes = [(piece.index,) for piece in slices]
    return spark.sparkContext.parallelize(indexes, max(1, len(indexes))).toDF("slice int")


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
