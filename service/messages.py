"""Consumed Kafka messages → the transform's ``Record`` (the only such conversion)."""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message

from service.records import Record


def to_record(msg: Message) -> Record:
    """The transform's view of a consumed message; key and value stay raw bytes.

    Kafka allows null header values; the contract has bytes, so they become b"".
    """
    raw = cast("list[tuple[str, bytes | None]] | None", msg.headers())
    headers = tuple((name, value or b"") for name, value in raw) if raw else ()
    return Record(cast(str, msg.topic()), cast(int, msg.partition()), cast(int, msg.offset()),
                  msg.timestamp()[1], msg.key(), msg.value(), headers)
