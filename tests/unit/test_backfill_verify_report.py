"""What ``txstage backfill verify`` prints: a verdict in words and one line per kind of
difference for a person, one JSON object with ``--json``; exit 0 equal, 1 different."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.backfill import main, parity
from service.backfill.parity import Output, compare
from service.contract.letters import parse
from service.contract.processing import OutputRefusedError, process, refused
from service.contract.records import Output as Emit
from service.contract.records import Record
from service.tools.redrive.run import _marked

ORDER = Record("orders", 0, 17, 1000, b"k", b"v")


def out(src: str, idx: int = 0, *, value: bytes = b"v",
        extra: tuple[tuple[str, bytes], ...] = ()) -> Output:
    lineage = (("txstage.src", src.encode()), ("txstage.idx", str(idx).encode()))
    return Output("out", b"k", value, (*extra, *lineage))


def copy(record: Record) -> list[Emit]:
    return [Emit(record.value, record.key)]


def unlimited(topic: str) -> int:
    return 1 << 20


def redriven_order() -> tuple[list[Output], list[Output]]:
    """The stream: orders/0/17's letter (the broker refused its output), then the output
    txstage redrive wrote in its place; and a backfill's output of it."""
    [letter] = refused(ORDER, OutputRefusedError("refused"), "dlq").outputs
    parsed = parse("dlq", 0, 0, 1000, letter.key, letter.value, letter.headers)
    assert parsed is not None
    stream = [letter, *_marked(parsed, process(copy, parsed.original, default_topic="out",
                                               dlq_topic="dlq", max_bytes=unlimited))]
    backfill = process(copy, ORDER, default_topic="out", dlq_topic="dlq", max_bytes=unlimited)
    return ([Output(p.topic, p.key, p.value, tuple(p.headers)) for p in stream],
            [Output(p.topic, p.key, p.value, tuple(p.headers)) for p in backfill.outputs])


def differing() -> tuple[list[Output], list[Output]]:
    expected = [*(out(f"orders/0/{offset}") for offset in range(4, 11)), out("orders/2/5"),
                out("orders/2/6", 1, extra=(("h", b"1"),))]
    actual = [out("orders/2/5", value=b"w"), out("orders/2/6", 1, extra=(("h", b"2"),)),
              out("orders/3/0"), out("orders/3/0"), Output("out", None, b"x", ())]
    return expected, actual


def test_equal_says_so_in_words_and_counts_the_letters_redrive_replaced() -> None:
    assert compare(*redriven_order()).lines() == [
        "EQUAL: 1 output matches",
        "  read 2 expected outputs, 1 actual",
        "  redrive (expected): 1 letter replaced by its redriven outputs",
    ]


def test_each_kind_of_difference_is_one_line_with_readable_examples() -> None:
    assert compare(*differing()).lines() == [
        "DIFFERENT: 12 differences; 0 outputs match",
        # Five examples at most, in offset order (orders/0/10 is not among them).
        "  missing 7, e.g. orders/0/4 output 0, orders/0/5 output 0, orders/0/6 output 0, "
        "orders/0/7 output 0, orders/0/8 output 0",
        "  extra 1, e.g. orders/3/0 output 0",
        "  different 2 (value, headers), e.g. orders/2/5 output 0 (value), "
        "orders/2/6 output 1 (headers)",
        "  duplicated in actual 1, e.g. orders/3/0 output 0",
        "  without lineage in actual 1",
        "  read 9 expected outputs, 4 actual",
    ]


def test_a_letter_facing_an_output_is_its_own_kind() -> None:
    stream, backfill = redriven_order()
    report = compare(stream[:1], backfill)  # not redriven yet
    assert report.lines()[:2] == ["DIFFERENT: 1 difference; 0 outputs match",
                                  "  dead-lettered in expected only 1, e.g. orders/0/17 output 0"]


@pytest.fixture
def sides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
          ) -> Iterator[dict[str, list[Output]]]:
    """What ``kafka://stream`` and ``kafka://backfill`` hold, read without a broker."""
    monkeypatch.chdir(tmp_path)  # no stray .env
    held: dict[str, list[Output]] = {}
    monkeypatch.setattr(parity, "read", lambda where, bootstrap: iter(held[where]))
    yield held


VERIFY = ["verify", "--expected", "kafka://stream", "--actual", "kafka://backfill"]


def test_verify_prints_the_report_and_exits_0_when_equal_1_when_not(
        sides: dict[str, list[Output]], capsys: pytest.CaptureFixture[str]) -> None:
    sides["kafka://stream"], sides["kafka://backfill"] = redriven_order()
    assert main(VERIFY) == 0
    assert capsys.readouterr().out == ("EQUAL: 1 output matches\n"
                                       "  read 2 expected outputs, 1 actual\n"
                                       "  redrive (expected): 1 letter replaced by its "
                                       "redriven outputs\n")
    sides["kafka://stream"], sides["kafka://backfill"] = differing()
    assert main(VERIFY) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "DIFFERENT: 12 differences; 0 outputs match"
    assert "(" not in printed[1].partition("e.g.")[2]  # coordinates, not Python tuples


def test_verify_json_is_one_object_for_machines(
        sides: dict[str, list[Output]], capsys: pytest.CaptureFixture[str]) -> None:
    sides["kafka://stream"], sides["kafka://backfill"] = redriven_order()
    assert main([*VERIFY, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["verdict"] == "EQUAL" and not any(found["counts"].values())
    assert (found["matching"], found["expected"], found["actual"]) == (1, 2, 1)
    assert found["redrive"]["expected"] == {"by_redriven": 1, "by_later_attempt": 0}

    sides["kafka://stream"], sides["kafka://backfill"] = differing()
    assert main([*VERIFY, "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert found["verdict"] == "DIFFERENT"
    assert found["counts"] == {"missing": 7, "extra": 1, "different": 2,
                               "dead_lettered_expected": 0, "dead_lettered_actual": 0,
                               "duplicated_expected": 0, "duplicated_actual": 1,
                               "unstamped_expected": 0, "unstamped_actual": 1}
    assert found["different_fields"] == ["value", "headers"]
    assert len(found["examples"]["missing"]) == 5
    assert found["examples"]["different"] == [
        {"input": "orders/2/5", "output": 0, "fields": ["value"]},
        {"input": "orders/2/6", "output": 1, "fields": ["headers"]}]
    assert found["examples"]["duplicated_actual"] == [{"input": "orders/3/0", "output": 0}]
