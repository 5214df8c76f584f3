"""Redrive's reading of a dead letter: the original record rebuilt from the letter the
stage wrote (its own code builds them here), and what is not a letter."""

from __future__ import annotations

from service.contract.letters import Letter, parse
from service.contract.processing import OutputRefusedError, Produced, refused
from service.contract.records import Record
from service.tools.redrive.run import _marked


def letter_of(record: Record) -> Produced:
    [letter] = refused(record, OutputRefusedError("refused"), "dlq").outputs
    return letter


def read(letter: Produced, offset: int = 3) -> Letter | None:
    return parse("dlq", 0, offset, 2000, letter.key, letter.value, letter.headers)


def test_the_original_record_is_rebuilt_with_its_headers_and_coordinates() -> None:
    original = Record("in", 2, 41, 1000, b"k", b"v", (("trace", b"t"), ("empty", b"")))
    letter = read(letter_of(original))
    assert letter == Letter("dlq", 0, 3, Record("in", 2, 41, 2000, b"k", b"v",
                                                 original.headers),
                            "OutputRefusedError", 0)


def test_an_input_from_another_stage_keeps_its_own_lineage_and_error_headers() -> None:
    # A chained pipeline: the input is another stage's output, or one of its dead letters.
    upstream = (("txstage.src", b"upstream/2/41"), ("txstage.idx", b"0"), ("trace", b"t"))
    upstream_letter = (*upstream, ("txstage.error.class", b"ValueError"),
                       ("txstage.error.message", b"m"), ("txstage.error.topic", b"up"),
                       ("txstage.error.partition", b"1"), ("txstage.error.offset", b"9"),
                       ("txstage.src", b"up/1/9"), ("txstage.idx", b"0"),
                       ("txstage.redrive.attempt", b"2"))
    for headers in (upstream, upstream_letter):
        original = Record("in", 0, 7, 1000, b"k", b"v", headers)
        letter = read(letter_of(original))
        assert letter is not None and letter.attempt == 0
        assert letter.original.headers == headers
        assert (letter.original.topic, letter.original.offset) == ("in", 7)


def test_a_letter_redrive_wrote_again_keeps_the_original_and_counts_its_attempt() -> None:
    original = Record("in", 0, 7, 1000, b"k", b"v", (("txstage.src", b"upstream/2/41"),
                                                     ("txstage.idx", b"1")))
    first = read(letter_of(original), offset=3)
    assert first is not None
    [again] = _marked(first, refused(first.original, OutputRefusedError("refused"), "dlq"))
    second = read(again, offset=8)
    assert second is not None and second.attempt == 1
    assert second.original == first.original


def test_a_record_without_the_stage_s_suffix_is_not_a_letter() -> None:
    letter = letter_of(Record("in", 0, 7, 1000, b"k", b"v"))
    headers = list(letter.headers)
    assert read(Produced("dlq", b"k", b"v", [])) is None
    assert read(Produced("dlq", b"k", b"v", headers[:-1])) is None  # no txstage.idx
    assert read(Produced("dlq", b"k", b"v", [*headers, ("trace", b"t")])) is None
    assert read(Produced("dlq", b"k", b"v", [*headers[:2], *headers[3:]])) is None
