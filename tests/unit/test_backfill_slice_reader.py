"""The backfill's own slice reader (service.backfill.slice_reader) against a scripted
consumer: what it asks librdkafka for and where it stops. The real broker's side is in
tests/integration/test_backfill_kafka.py (every Kafka-source backfill reads this way)."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from service.backfill import slice_reader

SETTINGS: Any = None  # only the consumer's configuration would read it; it is replaced


def record(offset: int) -> Message:
    return Message(topic="in", partition=3, offset=offset, key=b"k", value=b"%d" % offset,
                   timestamp=(1, 1000 + offset))


def end_of_partition(offset: int) -> Message:
    return Message(topic="in", partition=3, offset=offset,
                   error=KafkaError(KafkaError._PARTITION_EOF))


class ScriptedConsumer:
    """Hands out the scripted batches, one per consume(), and records the calls."""

    def __init__(self, batches: list[list[Message]]) -> None:
        self.batches = batches
        self.assigned: list[tuple[str, int, int]] = []
        self.asked: list[int] = []
        self.closed = False

    def assign(self, partitions: list[object]) -> None:
        self.assigned = [(p.topic, p.partition, p.offset) for p in partitions]  # type: ignore[attr-defined]

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self.asked.append(num_messages)
        return self.batches.pop(0) if self.batches else []

    def close(self) -> None:
        self.closed = True


def read(consumer: ScriptedConsumer, start: int, end: int, **kwargs: float) -> list[int]:
    with patch("service.backfill.kafka_clients.range_consumer", return_value=consumer):
        return [r.offset for r in slice_reader.read_range(SETTINGS, "in", 3, start, end,
                                                          **kwargs)]


def test_the_read_starts_at_the_given_offset_and_stops_at_the_end_without_waiting() -> None:
    consumer = ScriptedConsumer([[record(o) for o in range(10, 14)],
                                 [record(o) for o in range(14, 16)]])
    assert read(consumer, 10, 16) == [10, 11, 12, 13, 14, 15]
    assert consumer.assigned == [("in", 3, 10)]
    # consume() waits its whole timeout unless it gets as many messages as asked for:
    # the reader never asks for more than the range still holds.
    assert consumer.asked == [6, 2]
    assert consumer.closed


def test_a_gap_at_the_end_ends_the_read_at_the_first_record_beyond_it() -> None:
    consumer = ScriptedConsumer([[record(10), record(11), record(14), record(15)]])
    assert read(consumer, 10, 14) == [10, 11]


def test_the_end_of_the_partition_ends_the_read() -> None:
    consumer = ScriptedConsumer([[record(10)], [], [end_of_partition(12)]])
    assert read(consumer, 10, 20) == [10]
    assert consumer.asked == [10, 9, 9]


def test_an_empty_range_opens_no_consumer() -> None:
    consumer = ScriptedConsumer([])
    assert read(consumer, 20, 20) == []
    assert consumer.assigned == []


def test_a_fetch_error_fails_the_read_and_closes_the_consumer() -> None:
    broken = Message(topic="in", partition=3, offset=11,
                     error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    consumer = ScriptedConsumer([[record(10), broken]])
    with pytest.raises(KafkaException):
        read(consumer, 10, 20)
    assert consumer.closed


def test_kafka_silent_past_the_idle_timeout_fails_the_read() -> None:
    consumer = ScriptedConsumer([])
    with pytest.raises(TimeoutError):
        read(consumer, 10, 20, idle_timeout_s=0.0)


def test_offsets_retention_deleted_fail_the_read_instead_of_jumping() -> None:
    # With auto.offset.reset=error librdkafka reports the out-of-range start instead of
    # reading on from the log start (the slice was marked done, its head missing).
    gone = Message(topic="in", partition=3, offset=-1001,
                   error=KafkaError(KafkaError._AUTO_OFFSET_RESET, "Offset out of range"))
    with pytest.raises(slice_reader.InputGoneError, match="in/3: offset 10 is no longer"):
        read(ScriptedConsumer([[gone]]), 10, 20)


def test_the_range_reader_does_not_reset_to_the_log_start() -> None:
    from service.backfill.kafka_clients import range_consumer
    from service.settings import load_settings

    settings = load_settings({"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TXSTAGE_GROUP_ID": "g",
                              "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
                              "TXSTAGE_TRANSFORM": "service.examples.square:square"})
    with patch("service.backfill.kafka_clients.Consumer") as made:
        range_consumer(settings)
    config = made.call_args.args[0]
    assert config["auto.offset.reset"] == "error" and config["enable.partition.eof"]
