"""The audit's per-partition ledger: a few bytes per input offset, and every kind of
finding it must report (or must not)."""

from service.tools.audit.ledger import Finding, PartitionLedger, digest


def outputs(*values: bytes) -> list[int]:
    return [digest(i, "out", b"k", v) for i, v in enumerate(values)]


def test_all_outputs_seen_once_is_clean_and_zero_output_inputs_need_nothing() -> None:
    ledger = PartitionLedger(10, 13)
    ledger.expect(10, outputs(b"a", b"b"))
    ledger.expect(11, [])  # a filter: no output
    ledger.expect(12, outputs(b"c"))
    assert ledger.see(10, 1, digest(1, "out", b"k", b"b")) is None
    assert ledger.see(10, 0, digest(0, "out", b"k", b"a")) is None
    assert ledger.see(12, 0, digest(0, "out", b"k", b"c")) is None
    assert list(ledger.findings()) == []


def test_a_second_copy_is_a_duplicate_and_a_missing_index_is_missing() -> None:
    ledger = PartitionLedger(0, 2)
    ledger.expect(0, outputs(b"a"))
    ledger.expect(1, outputs(b"x", b"y"))
    assert ledger.see(0, 0, digest(0, "out", b"k", b"a")) is None
    assert ledger.see(0, 0, digest(0, "out", b"k", b"a")) is Finding.DUPLICATE
    assert ledger.see(1, 0, digest(0, "out", b"k", b"x")) is None
    assert list(ledger.findings()) == [(Finding.MISSING, 1)]


def test_an_index_the_transform_does_not_make_is_unexpected() -> None:
    ledger = PartitionLedger(0, 1)
    ledger.expect(0, outputs(b"a"))
    assert ledger.see(0, 3, 0) is Finding.UNEXPECTED


def test_different_content_is_a_mismatch() -> None:
    ledger = PartitionLedger(0, 1)
    ledger.expect(0, outputs(b"a"))
    assert ledger.see(0, 0, digest(0, "out", b"k", b"not a")) is None
    assert list(ledger.findings()) == [(Finding.MISMATCHED, 0)]


def test_a_write_time_dead_letter_stands_for_all_outputs_but_not_beside_them() -> None:
    ledger = PartitionLedger(0, 2)
    ledger.expect(0, outputs(b"a", b"b"))
    ledger.expect(1, outputs(b"c"))
    assert ledger.letter(0, 0, replaces_outputs=True) is None
    assert ledger.letter(1, 0, replaces_outputs=True) is None
    assert ledger.see(1, 0, digest(0, "out", b"k", b"c")) is None  # and its output too
    assert list(ledger.findings()) == [(Finding.DUPLICATE, 1)]


def test_wide_fanouts_past_the_byte_mask_are_tracked_exactly() -> None:
    values = [str(i).encode() for i in range(300)]
    ledger = PartitionLedger(0, 1)
    ledger.expect(0, outputs(*values))
    for i, v in enumerate(values[:-1]):
        assert ledger.see(0, i, digest(i, "out", b"k", v)) is None
    assert ledger.see(0, 42, digest(42, "out", b"k", values[42])) is Finding.DUPLICATE
    assert ledger.see(0, 200, digest(200, "out", b"k", values[200])) is Finding.DUPLICATE
    assert list(ledger.findings()) == [(Finding.MISSING, 0)]
    assert ledger.see(0, 299, digest(299, "out", b"k", values[299])) is None
    assert list(ledger.findings()) == []


def test_memory_is_ten_bytes_per_input_offset() -> None:
    ledger = PartitionLedger(1_000, 101_000)
    arrays = (ledger.expected, ledger.seen, ledger.want, ledger.got)
    assert sum(len(a) * getattr(a, "itemsize", 1) for a in arrays) == 100_000 * 10


def test_an_input_the_transform_fails_on_needs_one_dead_letter_per_attempt() -> None:
    ledger = PartitionLedger(0, 3)
    for offset in range(3):
        ledger.expect_letter(offset)
    assert ledger.letter(0, 0) is None
    assert ledger.letter(1, 0) is None
    assert ledger.letter(1, 1) is None  # redriven, failed again: a second letter
    assert ledger.letter(1, 1) is Finding.DUPLICATE
    assert ledger.see(0, 0, 1) is Finding.UNEXPECTED  # an output beside its letter
    assert list(ledger.findings()) == [(Finding.MISSING, 2)]


def test_a_dead_letter_later_redriven_is_clean_and_one_not_yet_redriven_is_pending() -> None:
    ledger = PartitionLedger(0, 3)
    for offset in range(3):  # the transform was fixed: it now makes one output of each
        ledger.expect(offset, outputs(b"v"))
        assert ledger.letter(offset, 0) is None
    assert ledger.see(0, 0, digest(0, "out", b"k", b"v"), redriven=True) is None
    assert ledger.see(2, 0, digest(0, "out", b"k", b"v")) is None  # not by redrive
    assert list(ledger.findings()) == [(Finding.PENDING, 1), (Finding.DUPLICATE, 2)]


def test_write_time_letters_of_one_input_differ_by_their_redrive_attempt() -> None:
    # The stage dead-lettered input 0 (its output too large), a redrive met a refusal
    # again (attempt 1): two letters, no duplicate. A second letter of attempt 1 is one.
    ledger = PartitionLedger(0, 1)
    ledger.expect(0, outputs(b"v"))
    assert ledger.letter(0, 0, replaces_outputs=True) is None
    assert ledger.letter(0, 1, replaces_outputs=True) is None
    assert list(ledger.findings()) == []
    assert ledger.letter(0, 1, replaces_outputs=True) is Finding.DUPLICATE
    assert ledger.letter(0, 1) is Finding.DUPLICATE  # whatever the letter's kind


def test_outputs_redriven_in_place_of_a_write_time_letter_are_checked_like_any() -> None:
    ledger = PartitionLedger(0, 3)
    for offset in range(3):  # the outputs were refused; the topic was fixed, redriven
        ledger.expect(offset, outputs(b"a", b"b"))
        assert ledger.letter(offset, 0, replaces_outputs=True) is None
    for index, value in enumerate([b"a", b"b"]):
        assert ledger.see(0, index, digest(index, "out", b"k", value), redriven=True) is None
    assert ledger.see(1, 0, digest(0, "out", b"k", b"a"), redriven=True) is None
    assert ledger.see(2, 0, digest(0, "out", b"k", b"a"), redriven=True) is None
    assert ledger.see(2, 1, digest(1, "out", b"k", b"not b"), redriven=True) is None
    assert list(ledger.findings()) == [(Finding.MISSING, 1), (Finding.MISMATCHED, 2)]
