"""Record and Output, the transform contract, build with their own ``__init__`` (for
speed) and must stay what a frozen dataclass with the same fields is: same order,
defaults, keywords, equality, hash, repr, ``replace`` and immutability."""

from __future__ import annotations

import dataclasses

import pytest

from service.contract.records import Output, Record

FIELDS = ("in", 3, 42, 1_700_000_000_000, b"k", b"v", (("h", b"1"),))


@dataclasses.dataclass(frozen=True, slots=True)
class GeneratedRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def test_a_record_holds_what_it_was_built_with_positionally_or_by_keyword() -> None:
    record = Record(*FIELDS)
    assert dataclasses.astuple(record) == FIELDS
    assert dataclasses.astuple(record) == dataclasses.astuple(GeneratedRecord(*FIELDS))
    names = [field.name for field in dataclasses.fields(Record)]
    assert Record(**dict(zip(names, FIELDS, strict=True))) == record
    assert Record("in", 0, 0, 0, None, None).headers == ()
    assert repr(record).removeprefix("Record") \
        == repr(GeneratedRecord(*FIELDS)).removeprefix("GeneratedRecord")


def test_records_compare_and_hash_by_value_and_stay_frozen() -> None:
    record = Record(*FIELDS)
    assert record == Record(*FIELDS) and hash(record) == hash(Record(*FIELDS))
    assert record != Record("in", 3, 43, *FIELDS[3:])
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.offset = 43  # type: ignore[misc]
    assert dataclasses.replace(record, offset=43).offset == 43


def test_an_output_has_its_defaults_and_keywords() -> None:
    out = Output(b"v")
    assert (out.value, out.key, out.topic, out.headers) == (b"v", None, None, ())
    full = Output(value=b"v", key=b"k", topic="t", headers=(("h", b"1"),))
    assert dataclasses.astuple(full) == (b"v", b"k", "t", (("h", b"1"),))
    assert full == Output(b"v", b"k", "t", (("h", b"1"),)) and hash(full) == hash(
        Output(b"v", b"k", "t", (("h", b"1"),)))
    assert repr(out) == "Output(value=b'v', key=None, topic=None, headers=())"
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.key = b"x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Output()  # type: ignore[call-arg]


def test_records_and_outputs_survive_pickling_as_spark_ships_them() -> None:
    import pickle

    record, out = Record(*FIELDS), Output(b"v", topic="t")
    assert pickle.loads(pickle.dumps(record)) == record
    assert pickle.loads(pickle.dumps(out)) == out
