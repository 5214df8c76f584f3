"""Comparing two sets of outputs by lineage."""

from __future__ import annotations

from service.backfill.parity import Output, compare, within_slices
from service.backfill.plan import Slice


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
