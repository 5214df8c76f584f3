"""Rows as Spark holds them ↔ service.Record in, service.contract.processing.Produced out.

Every source is normalised to INPUT_SCHEMA (the fields of service.Record plus the slice
index); the Parquet sink writes OUTPUT_SCHEMA: the produced record (topic, key, value,
headers with the lineage headers) plus its lineage as plain columns for querying.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from service.contract.processing import Produced
from service.contract.records import Record

HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])

INPUT_DDL = ("slice int, topic string, partition int, offset long, timestamp long, "
             "key binary, value binary, headers array<struct<key:string,value:binary>>")

OUTPUT_DDL = ("topic string, key binary, value binary, "
              "headers array<struct<key:string,value:binary>>, "
              "src_topic string, src_partition int, src_offset long, idx int")
OUTPUT_ARROW = pa.schema([
    ("topic", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
    ("headers", pa.list_(HEADER)), ("src_topic", pa.string()), ("src_partition", pa.int32()),
    ("src_offset", pa.int64()), ("idx", pa.int32()),
])

SUMMARY_DDL = ("slice int, skipped long, records long, outputs long, dead_lettered long, "
               "transactions long, aborts long")
SUMMARY_ARROW = pa.schema([
    ("slice", pa.int32()), ("skipped", pa.int64()), ("records", pa.int64()),
    ("outputs", pa.int64()), ("dead_lettered", pa.int64()), ("transactions", pa.int64()),
    ("aborts", pa.int64()),
])


_INPUT_COLUMNS = ("slice", "topic", "partition", "offset", "timestamp", "key", "value",
                  "headers")


def sliced_records(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, Record]]:
    """(slice index, record) for every input row, in the order Spark hands them over.

    Column by column: one Python list per column is faster than a dict per row. Like
    service.kafka.messages.to_record, a null header value becomes b"" (the contract has bytes).
    """
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in _INPUT_COLUMNS]
        for piece, topic, partition, offset, timestamp, key, value, headers in zip(
                *columns, strict=True):
            pairs = tuple((h["key"], h["value"] or b"") for h in headers) if headers else ()
            yield piece, Record(topic, partition, offset, timestamp, key, value, pairs)


def output_row(out: Produced, record: Record, idx: int) -> dict[str, Any]:
    return {"topic": out.topic, "key": out.key, "value": out.value,
            "headers": [{"key": k, "value": v} for k, v in out.headers],
            "src_topic": record.topic, "src_partition": record.partition,
            "src_offset": record.offset, "idx": idx}


def output_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=OUTPUT_ARROW)


def summary_batch(row: dict[str, int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([row], schema=SUMMARY_ARROW)
