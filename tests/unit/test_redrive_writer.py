"""The redrive's transactional writer: which letters an output the broker refuses is
blamed on, and what is written for each letter of the batch then."""

from __future__ import annotations

from typing import cast

from confluent_kafka import KafkaError

from service.contract import letters
from service.contract.processing import Produced
from service.contract.records import Output, Record
from service.errors import AbortableError, Failure, Where
from service.kafka.producer import PinnedProducer
from service.tools.redrive.run import RedriveReport, _Writer

MARKS = "p.redrive.progress"


class RefusingProducer:
    """Refuses, at the first commit, every output whose value is ``b"poison"``: the
    failure names the number the output was queued with, as a delivery report does."""

    def __init__(self) -> None:
        self.queued: list[tuple[Produced, int]] = []
        self.committed: list[list[tuple[Produced, int]]] = []
        self.failures: list[Failure] = []
        self.refuse = True

    def begin(self) -> None:
        self.queued = []

    def produce_all(self, outputs: list[Produced], offset: int) -> None:
        self.queued += [(out, offset) for out in outputs]

    def produce(self, out: Produced, offset: int, *, partition: int | None = None) -> None:
        self.queued.append((out, offset))

    def commit(self) -> None:
        if self.refuse:
            self.refuse = False
            self.failures = [Failure(KafkaError.MSG_SIZE_TOO_LARGE, "MSG_SIZE_TOO_LARGE",
                                     "refused", offset)
                             for out, offset in self.queued if out.value == b"poison"]
            if self.failures:
                raise AbortableError(Where("commit_transaction"),
                                     KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.committed.append(self.queued)

    def take_failures(self) -> tuple[Failure, ...]:
        failures, self.failures = tuple(self.failures), []
        return failures

    def abort(self) -> None:
        self.queued = []


def copy(record: Record) -> list[Output]:
    return [Output(record.value, record.key)]


def letter(dlq_partition: int, dlq_offset: int, src_offset: int, value: bytes
           ) -> letters.Letter:
    headers = [("txstage.error.class", b"ValueError"), ("txstage.error.message", b"x"),
               ("txstage.error.topic", b"in"), ("txstage.error.partition", b"0"),
               ("txstage.error.offset", str(src_offset).encode()),
               ("txstage.src", f"in/0/{src_offset}".encode()), ("txstage.idx", b"0")]
    parsed = letters.parse("dlq", dlq_partition, dlq_offset, 1000, b"k", value, headers)
    assert parsed is not None
    return parsed


def test_a_refusal_re_dead_letters_only_its_letter_not_the_same_offset_of_another_partition(
        ) -> None:
    producer = RefusingProducer()
    report = RedriveReport()
    writer = _Writer(cast(PinnedProducer, producer), MARKS, copy, "out", "dlq",
                     lambda topic: 1 << 20, report, 10)
    writer.add(letter(0, 5, 100, b"poison"))  # its output is refused
    writer.add(letter(1, 5, 200, b"fine"))  # another DLQ partition, the same offset
    writer.flush()

    assert (report.failed_again, report.redriven, report.outputs) == (1, 1, 1), report
    [written] = producer.committed
    outputs = [(out.topic, out.value, dict(out.headers)) for out, _ in written
               if out.topic != MARKS]
    assert [(topic, value) for topic, value, _ in outputs] == [("dlq", b"poison"),
                                                              ("out", b"fine")]
    assert outputs[0][2]["txstage.error.class"] == b"OutputRefusedError"
    assert outputs[0][2]["txstage.redrive.attempt"] == b"1"
    assert outputs[1][2]["txstage.redriven"] == b"dlq/1/5"
    assert outputs[1][2]["txstage.src"] == b"in/0/200"
    assert [out.key for out, _ in written if out.topic == MARKS] == [b"dlq/0/5", b"dlq/1/5"]
