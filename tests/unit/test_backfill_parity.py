"""Comparing two sets of outputs by lineage, and the lineage ``txstage redrive`` leaves."""

from __future__ import annotations

from collections.abc import Iterable

from service.backfill.parity import Output, Reconciled, compare, with_parking, within_slices
from service.backfill.plan import Slice
from service.contract.letters import parse
from service.contract.lineage import REDRIVEN
from service.contract.processing import Produced, process
from service.contract.records import Output as Emit
from service.contract.records import Record, Transform
from service.tools.redrive.run import _marked


def out(offset: int, idx: int = 0, *, topic: str = "out", value: bytes = b"v",
        key: bytes | None = b"k", extra: tuple[tuple[str, bytes], ...] = ()) -> Output:
    lineage = (("txstage.src", f"in/0/{offset}".encode()), ("txstage.idx", str(idx).encode()))
    return Output(topic, key, value, (*extra, *lineage))


def test_identical_outputs_in_any_order_are_identical() -> None:
    report = compare([out(1), out(2), out(2, 1)], [out(2, 1), out(1), out(2)])
    assert report.ok and report.expected == report.actual == 3


def test_missing_extra_and_different_outputs_are_named() -> None:
    report = compare([out(1), out(2), out(3, extra=(("h", b"1"),))],
                     [out(2, value=b"other"), out(3, extra=(("h", b"2"),)), out(4)])
    assert report.missing == [("in/0/1", 0)]
    assert report.extra == [("in/0/4", 0)]
    assert report.different == [(("in/0/2", 0), ("value",)), (("in/0/3", 0), ("headers",))]
    assert not report.ok


def test_duplicates_on_either_side_are_violations() -> None:
    report = compare([out(1)], [out(1), out(1)])
    assert report.duplicated_actual == [("in/0/1", 0)]
    assert not report.ok


def test_renamed_topics_compare_equal() -> None:
    assert compare([out(1, topic="stream-out")], [out(1, topic="backfill-out")],
                   rename={"stream-out": "backfill-out"}).ok
    assert compare([out(1, topic="stream-out")], [out(1, topic="backfill-out")]).different


def test_null_and_empty_differ() -> None:
    assert compare([out(1, key=None)], [out(1, key=b"")]).different


def test_outputs_without_lineage_are_counted() -> None:
    report = compare([], [Output("out", None, b"x", ())])
    assert report.unstamped_actual == 1 and not report.ok


def test_within_restricts_to_a_plan() -> None:
    accept = within_slices([Slice(0, "in", 0, 2, 4)])
    report = compare([out(1), out(2), out(3)], [out(2), out(3)], within=accept)
    assert report.ok and report.expected == 2


# -- redrive lineage: records built by the code that writes them --------------------------
#
# The stream ran ``broken``, which fails on in/0/1 (a letter at dlq/0/0); the transform
# was fixed, then ``txstage redrive`` wrote in/0/1's outputs (or the letter again); a
# backfill of the fixed transform wrote to out-v2 and dlq-v2.

INPUTS = [Record("in", 0, offset, 1000, b"k", str(offset).encode()) for offset in range(4)]
V2 = {"out": "out-v2", "dlq": "dlq-v2"}


def fixed(record: Record) -> list[Emit]:
    # Two outputs: a redrive writes more indexes than the letter it replaces had.
    return [Emit(record.value, record.key), Emit(b"%s!" % record.value, record.key)]


def broken(record: Record) -> list[Emit]:
    if record.offset == 1:
        raise ValueError("not yet")
    return fixed(record)


def unlimited(topic: str) -> int:
    return 1 << 20


def run(transform: Transform, record: Record, out: str = "out", dlq: str = "dlq"
        ) -> list[Produced]:
    return process(transform, record, default_topic=out, dlq_topic=dlq,
                   max_bytes=unlimited).outputs


def read_back(written: Iterable[Produced]) -> list[Output]:
    return [Output(p.topic, p.key, p.value, tuple(p.headers)) for p in written]


def stream() -> tuple[list[Produced], Produced]:
    """What the stream wrote with ``broken``, and its letter."""
    written = [p for record in INPUTS for p in run(broken, record)]
    [letter] = [p for p in written if p.topic == "dlq"]
    return written, letter


def redrive(letter: Produced, offset: int, transform: Transform) -> list[Produced]:
    """What txstage redrive writes for the letter at dlq/0/``offset``."""
    parsed = parse("dlq", 0, offset, 2000, letter.key, letter.value, letter.headers)
    assert parsed is not None
    return _marked(parsed, process(transform, parsed.original, default_topic="out",
                                   dlq_topic="dlq", max_bytes=unlimited))


def backfill(transform: Transform = fixed) -> list[Output]:
    return read_back(p for record in INPUTS for p in run(transform, record, "out-v2", "dlq-v2"))


def test_after_a_redrive_the_stream_equals_a_backfill_of_the_fixed_transform() -> None:
    written, letter = stream()
    history = read_back([*written, *redrive(letter, 0, fixed)])
    for order in (history, history[::-1]):  # topics are read in no particular order
        report = compare(order, backfill(), rename=V2)
        assert report.ok, report.problems()
        assert (report.expected, report.actual, report.matching) == (9, 8, 8)
        assert report.reconciled_expected == Reconciled(by_redriven=1)


def test_letters_of_every_attempt_are_replaced_by_the_outputs_redrive_wrote() -> None:
    written, letter = stream()
    [again] = redrive(letter, 0, broken)  # not fixed yet: the letter again, attempt 1
    assert dict(again.headers)["txstage.redrive.attempt"] == b"1"
    report = compare(read_back([*written, again, *redrive(again, 1, fixed)]), backfill(),
                     rename=V2)
    assert report.ok, report.problems()
    assert report.reconciled_expected == Reconciled(by_redriven=2)


def test_a_letter_written_again_equals_a_backfill_letter_of_the_same_failure() -> None:
    # A backfill of the transform still broken writes in/0/1's letter once (attempt 0);
    # the stream's latest is attempt 1. Both say the input fails with that error, which
    # is what a letter holds; how often redrive tried is its history, not compared.
    written, letter = stream()
    [again] = redrive(letter, 0, broken)
    report = compare(read_back([*written, again]), backfill(broken), rename=V2)
    assert report.ok, report.problems()
    assert report.reconciled_expected == Reconciled(by_later_attempt=1)

    def broken_otherwise(record: Record) -> list[Emit]:
        raise TypeError("broken another way")

    # A redrive that failed another way: its letter stands for the input, and differs.
    [other] = redrive(letter, 0, broken_otherwise)
    report = compare(read_back([*written, other]), backfill(broken), rename=V2)
    assert report.different == [(("in/0/1", 0), ("headers",))]
    assert report.reconciled_expected == Reconciled(by_later_attempt=1)
    assert not report.duplicated_expected


def test_a_parked_letter_stands_for_its_input_under_the_parking_topic() -> None:
    written, letter = stream()
    [first] = redrive(letter, 0, broken)
    [second] = redrive(first, 1, broken)
    # Attempt 2 reached redrive's --max-attempts: the letter went to the parking topic.
    parked = Produced("dlq.parked", second.key, second.value,
                      [*second.headers, ("txstage.redrive.parked", b"1")])
    history = read_back([*written, first, parked])
    report = compare(history, backfill(broken), rename={**V2, "dlq.parked": "dlq-v2"})
    assert report.ok, report.problems()
    assert report.reconciled_expected == Reconciled(by_later_attempt=2)
    # Unless renamed itself, a parked letter compares as if in its DLQ: where redrive
    # keeps a letter is its history, as its attempt count is. Either way it is counted
    # as parked, in the topic that holds it.
    report = compare(history, backfill(broken), rename=V2)
    assert report.ok, report.problems()
    assert (report.parked_expected, report.parked_actual) == ({"dlq.parked": 1}, {})
    assert "  parked (expected): 1 letter in dlq.parked" in report.lines()
    assert report.as_dict()["parked"] == {"expected": {"dlq.parked": 1}, "actual": {}}


def test_every_parking_topic_of_a_named_topic_is_read() -> None:
    """``backfill verify --expected kafka://out,dlq`` reads ``dlq.parked`` too (and the
    ``dlq.parked.parked`` older redrives left), so no parked letter is left out."""
    there = {"dlq.parked", "dlq.parked.parked", "other"}
    assert with_parking(["out", "dlq"], there.__contains__) == [
        "out", "dlq", "dlq.parked", "dlq.parked.parked"]
    assert with_parking(["out", "dlq", "dlq.parked"], there.__contains__) == [
        "out", "dlq", "dlq.parked", "dlq.parked.parked"]
    assert with_parking(["out"], there.__contains__) == ["out"]


def test_a_parked_letter_redriven_since_is_not_counted_as_parked() -> None:
    written, letter = stream()
    [first] = redrive(letter, 0, broken)  # its first redrive failed: parked (--max-attempts 1)
    parked = Produced("dlq.parked", first.key, first.value,
                      [*first.headers, ("txstage.redrive.parked", b"1")])
    parsed = parse("dlq.parked", 0, 0, 1000, parked.key, parked.value, parked.headers)
    assert parsed is not None and parsed.parked
    redriven = _marked(parsed, process(fixed, parsed.original, default_topic="out",
                                       dlq_topic="dlq.parked", max_bytes=lambda t: 1 << 20))
    report = compare(read_back([*written, parked, *redriven]), backfill(), rename=V2)
    assert report.ok, report.problems()
    assert report.parked_expected == {}


def test_duplicates_beside_a_redrive_are_still_reported() -> None:
    written, letter = stream()
    redriven = redrive(letter, 0, fixed)
    # The stage's letter twice (one attempt): a duplicate, which the redrive replaced.
    report = compare(read_back([*written, letter, *redriven]), backfill(), rename=V2)
    assert report.duplicated_expected == [("in/0/1", 0)]
    assert report.reconciled_expected == Reconciled(by_redriven=2)
    assert report.matching == 8 and not (report.missing or report.extra or report.different)

    report = compare(read_back([*written, *redriven, *redriven]), backfill(), rename=V2)
    assert report.duplicated_expected == [("in/0/1", 0), ("in/0/1", 1)]

    # Outputs of the stage beside its letter: nothing replaces them; they are compared.
    report = compare(read_back([*written, *run(fixed, INPUTS[1])]), backfill(), rename=V2)
    assert report.duplicated_expected == [("in/0/1", 0)]
    assert report.reconciled_expected == Reconciled() and report.matching == 8


def test_a_redriven_output_that_differs_is_reported_by_its_field() -> None:
    def fixed_otherwise(record: Record) -> list[Emit]:
        return [Emit(record.value, record.key), Emit(b"%s?" % record.value, record.key)]

    written, letter = stream()
    report = compare(read_back([*written, *redrive(letter, 0, fixed_otherwise)]), backfill(),
                     rename=V2)
    assert report.different == [(("in/0/1", 1), ("value",))]
    assert report.matching == 7 and not report.ok
    assert not (report.missing or report.extra or report.duplicated_expected)


def test_a_letter_not_redriven_yet_is_named_as_such() -> None:
    written, _ = stream()
    report = compare(read_back(written), backfill(), rename=V2)
    assert report.dead_lettered_expected == [("in/0/1", 0)]
    assert report.extra == [("in/0/1", 1)] and not report.different


def test_redrive_marks_among_an_outputs_own_headers_are_content() -> None:
    # An input redriven by another stage carries that stage's mark; a transform that
    # keeps its input's headers copies it among its outputs' own, before the lineage.
    upstream = ((REDRIVEN, b"up-dlq/0/3"),)
    stage = out(1, extra=upstream)
    redriven = Output(stage.topic, stage.key, stage.value,
                      (*stage.headers, (REDRIVEN, b"dlq/0/0")))
    assert compare([redriven], [out(1, extra=upstream)]).ok
    assert compare([redriven], [out(1)]).different == [(("in/0/1", 0), ("headers",))]
