"""The audit's judgement of dead letters and the outputs ``txstage redrive`` writes in
their place, on records built by the code that writes them (the stage's dead letters,
redrive's marks) and read as the audit reads them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.contract.letters import Letter, parse
from service.contract.processing import OutputRefusedError, Produced, Result, process, refused
from service.contract.records import Output, Record, Transform
from service.kafka.cluster import UnknownTopicError
from service.tools.audit.ledger import PartitionLedger
from service.tools.audit.report import AuditReport
from service.tools.audit.run import _Audit
from service.tools.redrive.run import _marked

INPUT = Record("in", 0, 0, 1000, b"k", b"v")


class Message:
    """What the audit reads of a consumed record."""

    def __init__(self, topic: str, partition: int, offset: int, out: Produced | Record
                 ) -> None:
        self._where = (topic, partition, offset)
        self._key, self._value = out.key, out.value
        self._headers = list(out.headers)

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def timestamp(self) -> tuple[int, int]:
        return (0, 1000)

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


def copy(record: Record) -> list[Output]:
    return [Output(record.value, record.key)]


def unlimited(topic: str) -> int:
    return 1 << 20


def too_small(topic: str) -> int:
    """The output topic takes 10 bytes; the dead-letter topic takes the letter whole."""
    return 10 if topic == "out" else 1 << 62


def refused_by_the_broker(record: Record) -> Result:
    return refused(record, OutputRefusedError("refused"), "dlq")


def too_large_for_its_topic(record: Record) -> Result:
    return process(copy, record, default_topic="out", dlq_topic="dlq", max_bytes=too_small)


def read(letter: Produced, offset: int) -> Letter:
    """The letter at dlq/0/``offset`` as redrive reads it."""
    parsed = parse("dlq", 0, offset, 1000, letter.key, letter.value, letter.headers)
    assert parsed is not None
    return parsed


def audit(*written: tuple[str, int, Produced], transform: Transform = copy) -> AuditReport:
    run = _Audit({}, transform, "out", "dlq", "test.audit", 1.0, AuditReport())
    run.ledgers = {("in", 0): PartitionLedger(0, 1)}
    run._input(Message("in", 0, 0, INPUT))
    for topic, offset, out in written:
        run._output(Message(topic, 0, offset, out))
    run.judge()
    return run.report


@pytest.mark.parametrize("stage_letter", [refused_by_the_broker, too_large_for_its_topic])
def test_fixing_the_cause_of_a_write_time_letter_then_redriving_audits_clean(
        stage_letter: Callable[[Record], Result]) -> None:
    [letter] = stage_letter(INPUT).outputs  # dlq/0/0, attempt 0
    assert audit(("dlq", 0, letter)).ok

    # A redrive before the fix: the broker refuses the output again; redrive writes the
    # letter again with txstage.redrive.attempt 1.
    first = read(letter, 0)
    [again] = _marked(first, refused(first.original, OutputRefusedError("refused"), "dlq"))
    assert dict(again.headers)["txstage.redrive.attempt"] == b"1"
    report = audit(("dlq", 0, letter), ("dlq", 1, again))
    assert report.ok and report.letters_pending == 0, report.to_json()

    # The cause fixed, a redrive writes the output, marked txstage.redriven.
    second = read(again, 1)
    [output] = _marked(second, process(copy, second.original, default_topic="out",
                                       dlq_topic="dlq", max_bytes=unlimited))
    report = audit(("dlq", 0, letter), ("dlq", 1, again), ("out", 0, output))
    assert report.ok and report.letters_pending == 0, report.to_json()

    # Its output beside the letter without redrive's mark is still a duplicate.
    plain = process(copy, INPUT, default_topic="out", dlq_topic="dlq", max_bytes=unlimited)
    report = audit(("dlq", 0, letter), ("out", 0, plain.outputs[0]))
    assert report.violations["duplicate"].count == 1, report.to_json()


def to_a_new_topic(record: Record) -> list[Output]:
    return [Output(record.value, record.key, topic="new")]


def new_is_missing(topic: str) -> int:
    if topic == "new":
        raise UnknownTopicError(f"topic {topic!r} does not exist")
    return 1 << 20


def test_a_letter_of_an_output_to_a_missing_topic_stands_for_it_and_is_not_pending() -> None:
    # The stage's topic limits say the topic does not exist: the record is dead-lettered
    # (UnknownTopicError). The audit runs the transform without asking for limits: it
    # succeeds, as it did in the stage; only the topic was missing.
    stage = process(to_a_new_topic, INPUT, default_topic="out", dlq_topic="dlq",
                    max_bytes=new_is_missing)
    assert type(stage.error) is UnknownTopicError
    [letter] = stage.outputs
    report = audit(("dlq", 0, letter), transform=to_a_new_topic)
    assert report.ok and report.letters_pending == 0, report.to_json()

    # The topic created, a redrive writes the output in its place.
    redriven = read(letter, 0)
    [output] = _marked(redriven, process(to_a_new_topic, redriven.original,
                                         default_topic="out", dlq_topic="dlq",
                                         max_bytes=unlimited))
    report = audit(("dlq", 0, letter), ("new", 0, output), transform=to_a_new_topic)
    assert report.ok and report.letters_pending == 0, report.to_json()


def test_the_report_says_why_the_records_read_are_not_the_expected_outputs() -> None:
    # A write-time letter, then its redriven output: one output expected, two records
    # read, a clean audit. The summary said only "expected outputs 1" and "2 outputs".
    [letter] = refused_by_the_broker(INPUT).outputs
    redriven = read(letter, 0)
    [output] = _marked(redriven, process(copy, redriven.original, default_topic="out",
                                         dlq_topic="dlq", max_bytes=unlimited))
    report = audit(("dlq", 0, letter), ("out", 0, output))
    report.inputs, report.outputs_read, report.seconds = 1, 2, 1.0
    assert report.ok and report.expected_outputs == 1, report.to_json()
    lines = report.summary().splitlines()
    assert lines[0].startswith("audited 1 inputs in 0 partition(s) and 2 records of the "
                               "output, dead-letter and parking topics in 1.0 s"), lines[0]
    assert "the transform ran on every input, so its speed bounds this" in lines[0]
    assert lines[1].startswith("expected outputs 1: what the transform makes of the inputs "
                               "now, a dead letter for each it fails on."), lines[1]
    for counted in ("dead letters standing for outputs", "the letters beside redriven "
                    "outputs", "parked letters"):
        assert counted in lines[1], lines[1]


def broken(record: Record) -> list[Output]:
    raise ValueError("still broken")


def test_a_parked_letter_is_counted_once_per_input_and_named_by_the_topic_holding_it() -> None:
    """Parked letters are accounted for wherever they are read: counted per input (its
    latest letter), with the topic that holds it; an input redriven since is not."""
    [letter] = process(broken, INPUT, default_topic="out", dlq_topic="dlq",
                       max_bytes=unlimited).outputs
    first = read(letter, 0)
    [parked] = _marked(first, process(broken, first.original, default_topic="out",
                                      dlq_topic="dlq.parked", max_bytes=unlimited),
                       parked=True)
    run = _Audit({}, broken, "out", "dlq", "test.audit", 1.0, AuditReport())
    run.letter_topics.add("dlq.parked")
    run.ledgers = {("in", 0): PartitionLedger(0, 1)}
    run._input(Message("in", 0, 0, INPUT))
    run._output(Message("dlq", 0, 0, letter))
    run._output(Message("dlq.parked", 0, 0, parked))
    run.judge()
    report = run.report
    assert report.ok, report.to_json()
    assert (report.letters_parked, report.parked_in) == (1, {"dlq.parked": 1})
    assert "parked by redrive (accounted for): 1 (1 in dlq.parked)" in report.summary()

    # The cause fixed, the parking topic redriven: its outputs stand, nothing is parked.
    again = parse("dlq.parked", 0, 0, 1000, parked.key, parked.value, parked.headers)
    assert again is not None and again.parked
    [output] = _marked(again, process(copy, again.original, default_topic="out",
                                      dlq_topic="dlq.parked", max_bytes=unlimited))
    report = audit(("dlq", 0, letter), ("out", 0, output))
    assert report.ok and report.letters_parked == 0, report.to_json()
