"""Avro in, Avro out (docs/formats.md): an ``Order`` becomes a ``PricedOrder``.

Run with ``TXSTAGE_INPUT_VALUE_FORMAT=avro``, ``TXSTAGE_OUTPUT_VALUE_FORMAT=avro`` and
``TXSTAGE_OUTPUT_VALUE_SCHEMA=priced_order.avsc`` (the file beside this module). The
value arrives decoded (a dict, whichever registered version of ``Order`` wrote it) and
leaves as a dict the stage encodes with ``priced_order.avsc``'s registered id.
"""

from collections.abc import Iterator
from typing import Any

from service.contract.records import Output, Record


def price(record: Record) -> Iterator[Output]:
    order: Any = record.value
    yield Output(value={
        "id": order["id"],
        "amount_cents": round(order["amount"] * 100),
        "currency": order["currency"],
        "source": f"{record.topic}/{record.partition}/{record.offset}",
    }, key=record.key)  # type: ignore[arg-type]  # Output.value holds the decoded value
