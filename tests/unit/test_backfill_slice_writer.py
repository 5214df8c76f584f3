"""The slice writer's protocol against a fake producer: what is visible after each commit.

The fake keeps a log of committed records and the open transaction, so "visible" means
what a read_committed consumer would see. Errors are built directly, like librdkafka's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaError

from service import Output, Record
from service.backfill.plan import Slice
from service.backfill.progress import SliceProgress
from service.backfill.slice_writer import (
    IncompleteSliceError,
    InputOrderError,
    SliceTask,
    SliceWriter,
)
from service.contract.deadletter import DROPPED
from service.contract.processing import Produced, process
from service.errors import AbortableError, Failure, FencedError, PoisonRecordError, Where
from service.examples.square import square
from service.kafka.delivery import DeliveryFailures

PIECE = Slice(3, "in", 1, 100, 200)
TASK = SliceTask(PIECE, "job", "p.backfill.job.3", "progress", transaction_records=10,
                 transaction_ms=60_000)


def abortable() -> AbortableError:
    return AbortableError(Where("commit_transaction"),
                          KafkaError(KafkaError._MSG_TIMED_OUT, "x", txn_requires_abort=True))


def fenced() -> FencedError:
    return FencedError(Where("commit_transaction"), KafkaError(KafkaError._FENCED, "x", fatal=True))


class FakeProducer:
    """Stands in for service.kafka.producer.PinnedProducer (same methods, same error classes)."""

    transactional_id = TASK.transactional_id

    def __init__(self) -> None:
        self.deliveries = DeliveryFailures()
        self.committed: list[Produced] = []
        self.open: list[Produced] = []
        self.calls: list[str] = []
        self.fail_commit: list[Exception] = []  # raised by the next commits, in order
        self.in_transaction = False
        # Input offsets whose outputs the "broker" refuses (INVALID_RECORD) at commit;
        # whole_batch: every output of the transaction is reported, as when the broker
        # refuses a batch, so the reports cannot tell which record it was.
        self.refuse: set[int] = set()
        self.whole_batch = False
        self.reports: list[Failure] = []

    def init(self) -> None:
        self.calls.append("init")

    def take_failures(self) -> tuple[object, ...]:
        reports, self.reports = tuple(self.reports), []
        return self.deliveries.take() + reports

    def begin(self) -> None:
        assert not self.in_transaction, "begin inside a transaction"
        self.in_transaction = True
        self.calls.append("begin")

    def produce(self, out: Produced, offset: int, *, partition: int | None = None) -> None:
        assert self.in_transaction, "produce outside a transaction"
        if out.topic == "progress":
            assert partition == 0, "progress records must go to partition 0"
        self.open.append(out)

    def commit(self) -> None:
        self.calls.append("commit")
        if self.fail_commit:
            raise self.fail_commit.pop(0)
        offsets = [source_of(o) for o in self.open if o.topic == "out"]
        if self.refuse.intersection(offsets):
            named = offsets if self.whole_batch else sorted(self.refuse.intersection(offsets))
            self.reports += [Failure(KafkaError.INVALID_RECORD, "INVALID_RECORD", "refused", o)
                             for o in named]
            raise abortable()
        self.committed += self.open
        self.open, self.in_transaction = [], False

    def abort(self) -> None:
        self.calls.append("abort")
        self.open, self.in_transaction = [], False


    def outputs(self) -> list[Produced]:
        return [p for p in self.committed if p.topic != "progress"]

    def progress(self) -> list[dict[str, object]]:
        return [json.loads(p.value or b"") for p in self.committed if p.topic == "progress"]


def records(start: int, end: int, value: Callable[[int], bytes] = lambda i: b"%d" % i
            ) -> Iterator[Record]:
    return (Record("in", 1, i, 0, b"k", value(i)) for i in range(start, end))


def run(producer: FakeProducer, inputs: Iterator[Record], committed: SliceProgress | None = None,
        dlq: str | None = "dlq", *, piece: Slice = PIECE,
        unread: Callable[[int], int | None] | None = None) -> SliceWriter:
    def processing(record: Record) -> object:
        return process(square, record, default_topic="out", dlq_topic=dlq,
                       max_bytes=lambda _: 1 << 20)

    task = TASK if piece is PIECE else SliceTask(
        piece, TASK.job_id, TASK.transactional_id, TASK.progress_topic,
        TASK.transaction_records, TASK.transaction_ms)
    writer = SliceWriter(task, producer, lambda: committed, processing,  # type: ignore[arg-type]
                         dlq_topic=dlq, unread=unread)
    writer.run(lambda _start: inputs)
    return writer


def source_of(output: Produced) -> int:
    return int(dict(output.headers)["txstage.src"].split(b"/")[-1])


def sources(outputs: list[Produced]) -> list[int]:
    return [source_of(o) for o in outputs]


def test_fresh_slice_commits_outputs_with_progress_every_n_inputs() -> None:
    producer = FakeProducer()
    writer = run(producer, records(100, 125))
    assert sources(producer.outputs()) == list(range(100, 125))
    assert [p["next_offset"] for p in producer.progress()] == [110, 120, 200]
    assert producer.progress()[-1]["done"] is True and producer.progress()[-1]["records_in"] == 25
    assert producer.calls[0] == "init" and writer.outcome.transactions == 3


def test_a_transaction_also_commits_once_what_it_keeps_for_a_replay_reaches_its_bytes(
        ) -> None:
    # Each input here keeps 10 bytes: key b"k" and 3 digits in, key and 5 digits out.
    producer = FakeProducer()
    task = SliceTask(PIECE, TASK.job_id, TASK.transactional_id, TASK.progress_topic,
                     transaction_records=1_000, transaction_ms=60_000, transaction_bytes=50)
    writer = SliceWriter(task, producer, lambda: None,  # type: ignore[arg-type]
                         lambda record: process(square, record, default_topic="out",
                                                dlq_topic="dlq", max_bytes=lambda _: 1 << 20),
                         dlq_topic="dlq")
    writer.run(lambda _start: records(100, 125))
    assert [p["next_offset"] for p in producer.progress()] == [105, 110, 115, 120, 125, 200]
    assert sources(producer.outputs()) == list(range(100, 125))


def test_resumed_slice_skips_what_is_committed() -> None:
    producer = FakeProducer()
    earlier = SliceProgress(3, 100, 200, next_offset=117, records_in=17, outputs=17)
    writer = run(producer, records(100, 125), committed=earlier)
    assert sources(producer.outputs()) == list(range(117, 125))
    assert writer.outcome.skipped == 17
    assert producer.progress()[-1]["records_in"] == 25


def test_done_slice_writes_nothing() -> None:
    producer = FakeProducer()
    run(producer, records(100, 125), SliceProgress(3, 100, 200, 200, 25, 25, 0, done=True))
    assert producer.committed == [] and producer.calls == ["init"]


def test_abortable_commit_is_aborted_and_replayed_without_calling_the_transform_again() -> None:
    producer = FakeProducer()
    producer.fail_commit = [abortable()]
    calls: list[int] = []

    def counting(record: Record) -> Iterator[Output]:
        calls.append(record.offset)
        return square(record)

    def processing(record: Record) -> object:
        return process(counting, record, default_topic="out", dlq_topic=None,
                       max_bytes=lambda _: 1 << 20)

    writer = SliceWriter(TASK, producer, lambda: None, processing)  # type: ignore[arg-type]
    writer.run(lambda _start: records(100, 115))
    assert sources(producer.outputs()) == list(range(100, 115))
    assert calls == list(range(100, 115))
    assert writer.outcome.aborts == 1 and "abort" in producer.calls


def test_fenced_attempt_stops_and_leaves_nothing_visible() -> None:
    producer = FakeProducer()
    producer.fail_commit = [fenced()]
    with pytest.raises(FencedError):
        run(producer, records(100, 125))
    assert producer.committed == []


def test_poison_record_without_dlq_commits_what_came_before_then_fails() -> None:
    producer = FakeProducer()
    bad = lambda i: b"oops" if i == 104 else b"%d" % i  # noqa: E731
    with pytest.raises(PoisonRecordError, match="in/1@104"):
        run(producer, records(100, 110, bad), dlq=None)
    assert sources(producer.outputs()) == [100, 101, 102, 103]
    assert producer.progress()[-1]["next_offset"] == 104
    assert producer.progress()[-1]["done"] is False


def test_poison_record_with_dlq_is_dead_lettered_in_the_transaction() -> None:
    producer = FakeProducer()
    bad = lambda i: b"oops" if i == 104 else b"%d" % i  # noqa: E731
    writer = run(producer, records(100, 110, bad))
    dead = [o for o in producer.outputs() if o.topic == "dlq"]
    assert sources(dead) == [104] and writer.outcome.dead_lettered == 1
    assert producer.progress()[-1]["dead_lettered"] == 1


def test_empty_remaining_input_still_marks_the_slice_done() -> None:
    producer = FakeProducer()
    run(producer, records(0, 0), SliceProgress(3, 100, 200, 150, 50, 50))
    assert producer.progress() == [{**producer.progress()[0], "next_offset": 200, "done": True}]


@pytest.mark.parametrize("offsets", [[100, 100], [105, 101], [99], [200]])
def test_inputs_out_of_order_or_outside_the_slice_fail(offsets: list[int]) -> None:
    producer = FakeProducer()
    inputs = (Record("in", 1, o, 0, None, b"1") for o in offsets)
    with pytest.raises(InputOrderError):
        run(producer, inputs)
    assert producer.outputs() == []


def test_progress_of_another_plan_is_refused() -> None:
    with pytest.raises(InputOrderError, match="the plan changed"):
        run(FakeProducer(), records(100, 101), SliceProgress(3, 100, 150, 120))


@pytest.mark.parametrize("whole_batch", [False, True])
def test_a_record_whose_outputs_the_broker_refuses_is_dead_lettered_the_rest_committed(
        whole_batch: bool) -> None:
    # Issue 12, defect 1: the old writer replayed the transaction 3 times and failed the
    # task (and Spark the job) where the stream dead-letters that one record.
    producer = FakeProducer()
    producer.refuse, producer.whole_batch = {104, 117}, whole_batch
    writer = run(producer, records(100, 125))
    assert sources([o for o in producer.committed if o.topic == "out"]) == \
        [o for o in range(100, 125) if o not in (104, 117)]
    letters = [o for o in producer.committed if o.topic == "dlq"]
    assert sources(letters) == [104, 117]
    assert {dict(o.headers).get("txstage.error.class") for o in letters} == \
        {b"OutputRefusedError"}
    last = producer.progress()[-1]
    assert last["done"] is True and last["records_in"] == 25 and last["dead_lettered"] == 2
    assert writer.outcome.aborts >= 2


def test_a_refused_records_letter_is_built_to_fit_the_dead_letter_topic() -> None:
    # As the stream's (service.stage.batch): the writer's letter for a record whose
    # outputs the broker refused left nothing out whatever its size, so a record near
    # the topic's limit made a letter the producer refused too, and failed the job.
    producer = FakeProducer()
    producer.refuse = {104}
    task = SliceTask(PIECE, TASK.job_id, TASK.transactional_id, TASK.progress_topic,
                     transaction_records=10, transaction_ms=60_000)
    writer = SliceWriter(task, producer, lambda: None,  # type: ignore[arg-type]
                         lambda record: process(lambda r: [Output(r.value)], record,
                                                default_topic="out", dlq_topic="dlq",
                                                max_bytes=lambda _: 1 << 20),
                         dlq_topic="dlq", max_bytes=lambda _: 4_000)
    writer.run(lambda _start: records(100, 110, value=lambda i: b"v" * 5_000))
    [letter] = [o for o in producer.committed if o.topic == "dlq"]
    assert letter.value is None and dict(letter.headers)[DROPPED] == b"value=5000"


def test_a_refused_record_without_dlq_commits_what_came_before_then_fails() -> None:
    producer = FakeProducer()
    producer.refuse, producer.whole_batch = {104}, True
    with pytest.raises(PoisonRecordError) as raised:
        run(producer, records(100, 125), dlq=None)
    assert raised.value.offset == 104
    assert sources(producer.outputs()) == [100, 101, 102, 103]
    assert producer.progress()[-1]["next_offset"] == 104


# ------------------------------------------------- "done" only once the range was read


def test_a_kafka_slice_whose_input_stops_short_is_committed_but_not_done() -> None:
    """Defect 4: the writer marked a slice done at its end offset whatever it had read.
    Here the input stops at 124 while Kafka still has a record at 130."""
    producer, asked = FakeProducer(), []

    def unread(start: int) -> int | None:
        asked.append(start)
        return 130

    with pytest.raises(IncompleteSliceError, match=r"stopped at offset 124.*record at offset 130"):
        run(producer, records(100, 125), unread=unread)
    assert asked == [125]
    assert sources(producer.outputs()) == list(range(100, 125)), "what was read is kept"
    assert [p["next_offset"] for p in producer.progress()] == [110, 120, 125]
    assert not any(p["done"] for p in producer.progress())


def test_a_kafka_slice_that_ends_in_markers_or_aborted_records_is_done() -> None:
    producer = FakeProducer()
    run(producer, records(100, 198), unread=lambda start: None)
    assert producer.progress()[-1]["done"] is True


def test_a_kafka_slice_read_to_its_end_asks_nothing() -> None:
    producer = FakeProducer()

    def unread(start: int) -> int | None:
        raise AssertionError("no question when the last input is the range's last offset")

    run(producer, records(100, 200), unread=unread)
    assert producer.progress()[-1]["done"] is True


def test_a_file_slice_with_rows_missing_is_not_done() -> None:
    producer = FakeProducer()
    counted = Slice(3, "in", 1, 100, 200, records=30)
    with pytest.raises(IncompleteSliceError, match="29 of its 30 rows arrived"):
        run(producer, records(100, 129), piece=counted, unread=lambda start: None)
    assert not any(p["done"] for p in producer.progress())
    producer = FakeProducer()
    run(producer, records(100, 130), piece=counted, unread=lambda start: None)
    assert producer.progress()[-1]["done"] is True
