"""``service.tools.verify`` is the test suite's internal oracle, not an operator's tool
(``txstage audit`` is): it models neither dead letters written at write time nor what
``txstage redrive`` writes. On a pipeline the audit judged clean it reported those
inputs missing and their letters different, and after a redrive their outputs
duplicated and out of order: false verdicts. It now sets them aside as ``unjudged``
(the audit's rule for write-time letters), which says to run the audit."""

from __future__ import annotations

from service.contract.letters import parse
from service.contract.processing import OutputRefusedError, Produced, process, refused
from service.contract.records import Output, Record
from service.tools.redrive.run import _marked
from service.tools.verify import compare, expected_outputs

INPUTS = [Record("in", 0, offset, 1000, b"k", str(offset).encode()) for offset in range(4)]


def copy(record: Record) -> list[Output]:
    return [Output(record.value, record.key)]


def as_read(written: list[tuple[int, Produced]]) -> list[Record]:
    return [Record(out.topic, 0, offset, 1000, out.key, out.value, tuple(out.headers))
            for offset, out in written]


def unlimited(topic: str) -> int:
    return 1 << 20


def test_write_time_letters_and_redriven_outputs_are_unjudged_not_false_violations() -> None:
    expected = expected_outputs(INPUTS, copy, default_topic="out", dlq_topic="dlq")
    plain = [process(copy, r, default_topic="out", dlq_topic="dlq", max_bytes=unlimited)
             .outputs[0] for r in INPUTS]
    # The broker refused input 2's output: the stage wrote its letter instead.
    [letter] = refused(INPUTS[2], OutputRefusedError("refused"), "dlq").outputs
    written = [(0, plain[0]), (1, plain[1]), (0, letter), (2, plain[3])]
    report = compare(as_read(written), expected)
    assert not (report.missing or report.mismatched or report.duplicates
                or report.out_of_order), report.problems()
    assert report.unjudged == [("in/0/2", 0)] and not report.ok
    assert "not judged here (run txstage audit)" in report.problems()[0]

    # The cause fixed, redrive writes its output late, with its original's lineage.
    parsed = parse("dlq", 0, 0, 1000, letter.key, letter.value, letter.headers)
    assert parsed is not None
    [redriven] = _marked(parsed, process(copy, parsed.original, default_topic="out",
                                         dlq_topic="dlq", max_bytes=unlimited))
    report = compare(as_read([*written, (3, redriven)]), expected)
    assert not (report.missing or report.mismatched or report.duplicates
                or report.out_of_order), report.problems()
    assert report.unjudged == [("in/0/2", 0), ("in/0/2", 0)]


def test_a_real_loss_beside_an_unjudged_input_is_still_found() -> None:
    expected = expected_outputs(INPUTS, copy, default_topic="out", dlq_topic="dlq")
    [letter] = refused(INPUTS[2], OutputRefusedError("refused"), "dlq").outputs
    plain = process(copy, INPUTS[0], default_topic="out", dlq_topic="dlq",
                    max_bytes=unlimited).outputs[0]
    report = compare(as_read([(0, plain), (1, plain), (0, letter)]), expected)
    assert report.duplicates == [("in/0/0", 0)]
    assert report.missing == [("in/0/1", 0), ("in/0/3", 0)]


def test_a_model_that_dead_letters_the_input_judges_its_write_time_letter() -> None:
    """The tests check a stage whose outputs the broker refuses against a transform
    that fails on those inputs: the letter is expected, so it is judged, not set aside."""
    def failing_on_2(record: Record) -> list[Output]:
        if record.offset == 2:
            raise ValueError("refused by the broker")
        return copy(record)

    expected = expected_outputs(INPUTS, failing_on_2, default_topic="out", dlq_topic="dlq")
    plain = [process(copy, r, default_topic="out", dlq_topic="dlq", max_bytes=unlimited)
             .outputs[0] for r in INPUTS]
    [letter] = refused(INPUTS[2], OutputRefusedError("refused"), "dlq").outputs
    report = compare(as_read([(0, plain[0]), (1, plain[1]), (0, letter), (2, plain[3])]),
                     expected)
    assert report.ok and not report.unjudged, report.problems()
