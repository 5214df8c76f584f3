"""Consumed Kafka messages → the transform's ``Record`` (the only such conversion)."""

from __future__ import annotations

from confluent_kafka import Message

from service.contract.records import Record


def to_record(msg: Message) -> Record:
    """The transform's view of a consumed message; key and value stay raw bytes.

    Kafka allows null header values; the contract has bytes, so they become b"".
    (One call per record: no ``typing.cast`` calls, they cost a call each.)
    """
    raw: list[tuple[str, bytes | None]] | None = msg.headers()  # type: ignore[assignment]
    headers = tuple((name, value or b"") for name, value in raw) if raw else ()
    return Record(msg.topic(), msg.partition(), msg.offset(),  # type: ignore[arg-type]
                  msg.timestamp()[1], msg.key(), msg.value(), headers)
