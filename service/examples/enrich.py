"""JSON enrichment: add the record's coordinates and a derived field.

Input: a JSON object. Output: the same object with ``"source"`` (topic,
partition, offset, timestamp) and ``"amount_cents"`` when ``"amount"`` is a
number. Keys are sorted and separators fixed, so the output bytes are the same
wherever the transform runs (stream or backfill).
"""

import json
from collections.abc import Iterator

from service.contract.records import Output, Record


def enrich(record: Record) -> Iterator[Output]:
    if record.value is None:
        raise ValueError("enrich: the value is null, expected a JSON object")
    doc = json.loads(record.value)
    if not isinstance(doc, dict):
        raise TypeError(f"enrich: expected a JSON object, got {type(doc).__name__}")
    doc["source"] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
    }
    amount = doc.get("amount")
    if isinstance(amount, int | float) and not isinstance(amount, bool):
        doc["amount_cents"] = round(amount * 100)
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    yield Output(value=body, key=record.key, headers=(("content-type", b"application/json"),))
