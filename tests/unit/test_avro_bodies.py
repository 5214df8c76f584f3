"""Avro bodies through fastavro's compiled entry points: the same bytes and values as
its public ``schemaless_reader`` / ``schemaless_writer``, and the public functions when
the compiled ones are absent."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from service.formats import avro

USER = {"type": "record", "name": "User", "namespace": "t", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None},
    {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tags", "type": {"type": "map", "values": "bytes"}},
    {"name": "friend", "type": ["null", "User"], "default": None}]}
USERS = [
    {"id": 1, "name": "a", "email": None, "seen": 0, "tags": {}, "friend": None},
    {"id": -(2**40), "name": "é" * 300, "email": "x@y", "seen": 1_700_000_000_123,
     "tags": {"k": b"\x00\xff"}, "friend": {"id": 2, "name": "b", "email": None, "seen": 5,
                                           "tags": {}, "friend": None}},
]
# USER as a reader that added a field with a default and dropped two.
USER_V2 = {"type": "record", "name": "User", "namespace": "t", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "country", "type": "string", "default": "NL"},
    {"name": "friend", "type": ["null", "User"], "default": None}]}


def _public_body(schema: Any, value: object) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


@pytest.fixture(params=["compiled", "public"])
def entry_points(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "public":
        monkeypatch.setattr(avro, "compiled_entry_points", lambda: False)
    assert avro.compiled_entry_points() is (request.param == "compiled")
    return str(request.param)


@pytest.mark.parametrize("value", USERS, ids=["small", "nested"])
def test_a_body_is_what_the_public_writer_writes(entry_points: str, value: object) -> None:
    out = bytearray(b"\x00head")
    avro.writer(USER)(out, value)
    assert bytes(out) == b"\x00head" + _public_body(USER, value)


@pytest.mark.parametrize("value", USERS, ids=["small", "nested"])
def test_a_body_reads_as_the_public_reader_reads_it(entry_points: str, value: object) -> None:
    body = _public_body(USER, value)
    assert avro.reader(USER)(body) == fastavro.schemaless_reader(
        io.BytesIO(body), fastavro.parse_schema(USER))


def test_an_older_writers_body_reads_into_the_readers_view(entry_points: str) -> None:
    body = _public_body(USER, USERS[1])
    got: Any = avro.reader(USER, USER_V2)(body)
    assert got == {"id": USERS[1]["id"], "name": "é" * 300, "country": "NL",  # type: ignore[index]
                   "friend": {"id": 2, "name": "b", "country": "NL", "friend": None}}


def test_a_value_off_its_schema_raises_as_the_public_writer_does(entry_points: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        avro.writer(USER)(bytearray(), {"id": "not a long", "name": "a", "seen": 0,
                                        "tags": {}})


def test_a_truncated_body_raises(entry_points: str) -> None:
    with pytest.raises(EOFError):
        avro.reader(USER)(_public_body(USER, USERS[1])[:-3])


def test_this_install_has_the_compiled_entry_points() -> None:
    # The speed docs/formats.md states is the compiled path's; the wheel has it.
    assert avro.compiled_entry_points()
