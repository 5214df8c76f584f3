"""``new_record``, the hot paths' way to build a Record, builds the very object that
``Record(...)`` builds: same class, same fields, still frozen."""

from __future__ import annotations

import dataclasses

import pytest

from service.records import Record, new_record

FIELDS = ("in", 3, 42, 1_700_000_000_000, b"k", b"v", (("h", b"1"),))


def test_new_record_is_the_record_the_constructor_builds() -> None:
    fast, slow = new_record(*FIELDS), Record(*FIELDS)
    assert type(fast) is Record
    assert fast == slow and hash(fast) == hash(slow)
    assert dataclasses.astuple(fast) == FIELDS
    assert repr(fast) == repr(slow)


def test_a_new_record_is_still_frozen() -> None:
    record = new_record(*FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.offset = 43  # type: ignore[misc]


def test_null_key_and_value_and_no_headers() -> None:
    assert new_record("in", 0, 0, 0, None, None, ()) == Record("in", 0, 0, 0, None, None)
