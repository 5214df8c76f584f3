"""Reading a job's plan and progress from the progress topic, with a fake consumer."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from service.backfill.plan import Plan, Slice
from service.backfill.progress import (
    SliceProgress,
    encode_plan,
    encode_progress,
    plan_key,
    read_job,
    slice_key,
)

PLAN = Plan("job", "f", 100, (Slice(0, "in", 0, 0, 100), Slice(1, "in", 1, 0, 50)))


class Message:
    def __init__(self, offset: int, key: bytes | None = None, value: bytes | None = None,
                 eof: bool = False) -> None:
        self._offset, self._key, self._value, self._eof = offset, key, value, eof

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


class FakeConsumer:
    """Hands out ``batches`` one per consume() call, then nothing."""

    def __init__(self, batches: list[list[Message]]) -> None:
        self.batches = batches
        self.assigned: list[Any] = []
        self.asked: list[int] = []

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = partitions

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self.asked.append(num_messages)
        return self.batches.pop(0) if self.batches else []

    def close(self) -> None:
        pass


def progress(index: int, next_offset: int, done: bool = False) -> bytes:
    piece = PLAN.slices[index]
    return encode_progress(SliceProgress(index, piece.start, piece.end, next_offset,
                                         records_in=next_offset - piece.start, done=done))


def test_latest_progress_per_slice_wins_and_other_jobs_are_ignored() -> None:
    consumer = FakeConsumer([
        [Message(0, plan_key("job"), encode_plan(PLAN, {"sink": "kafka"}, 1)),
         Message(1, slice_key("job", 0), progress(0, 40)),
         Message(2, slice_key("other", 0), progress(0, 99)),
         Message(3, slice_key("job", 0), progress(0, 100, done=True)),
         Message(4, slice_key("job", 1), progress(1, 20))],
        [Message(5, eof=True)],
    ])
    state = read_job(consumer, "progress", "job", high_watermark=5)
    assert state.plan == PLAN and state.definition == {"sink": "kafka"}
    assert state.slices[0].done and state.slices[0].next_offset == 100
    assert state.slices[1].next_offset == 20
    assert not state.done()


def test_reading_waits_past_the_last_stable_offset_up_to_the_high_watermark() -> None:
    # EOF at 3 first: another slice's open transaction holds the last stable offset back,
    # and this slice's own last progress (offset 4) is not visible yet.
    consumer = FakeConsumer([
        [Message(1, slice_key("job", 1), progress(1, 10)), Message(3, eof=True)],
        [],
        [Message(4, slice_key("job", 1), progress(1, 30)), Message(6, eof=True)],
    ])
    state = read_job(consumer, "progress", "job", high_watermark=6)
    assert state.slices[1].next_offset == 30


def test_the_read_starts_at_the_low_watermark_and_asks_for_no_more_than_is_left() -> None:
    # A logical OFFSET_BEGINNING costs a new consumer librdkafka's 500 ms offset-query
    # retry; consume() waits its whole timeout unless it gets as many messages as asked.
    consumer = FakeConsumer([
        [Message(40, slice_key("job", 1), progress(1, 10))],
        [Message(42, slice_key("job", 1), progress(1, 30)), Message(44, eof=True)],
    ])
    state = read_job(consumer, "progress", "job", high_watermark=44, low_watermark=40)
    assert [(p.topic, p.partition, p.offset) for p in consumer.assigned] == \
        [("progress", 0, 40)]
    assert consumer.asked == [4, 3]
    assert state.slices[1].next_offset == 30


def test_an_empty_topic_has_no_state() -> None:
    state = read_job(FakeConsumer([]), "progress", "job", high_watermark=0)
    assert state.plan is None and state.slices == {}


def test_a_transaction_that_never_resolves_times_out() -> None:
    consumer = FakeConsumer([[Message(2, eof=True)]])
    with pytest.raises(TimeoutError, match="stays open"):
        read_job(consumer, "progress", "job", high_watermark=5, timeout_s=0.3)
