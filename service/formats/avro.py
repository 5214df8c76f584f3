"""Avro bodies read and written with a schema parsed once.

``fastavro.schemaless_reader`` and ``schemaless_writer`` parse their schema argument
again and build their option dicts on every call: about 0.8 µs of a read and 1.2 µs of a
write that are the same for every record of a topic (fastavro 1.13, Cython build). Both
are thin shells over fastavro's compiled ``_read_data`` and ``write_data``, which take
the parsed schema, its named types and the options; :func:`reader` and :func:`writer`
call those directly with everything prepared once when the compiled build is installed
and a probe record round-trips through them exactly as through the public functions
(checked once). Otherwise they call the public functions: the same bytes and values
either way, only slower (docs/formats.md, "Speed").
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any

import fastavro

try:  # the compiled build's entry points (absent from the pure-Python fallback)
    from fastavro._read import _read_data as _compiled_read  # type: ignore[attr-defined]
    from fastavro._write import write_data as _compiled_write  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - a fastavro built without its extensions
    _compiled_read = _compiled_write = None

# The defaults schemaless_reader / schemaless_writer pass (fastavro's own docs).
_READ_OPTIONS = {"return_record_name": False, "return_record_name_override": False,
                 "handle_unicode_errors": "strict", "return_named_type": False,
                 "return_named_type_override": False}
_WRITE_OPTIONS = {"strict": False, "strict_allow_default": False,
                  "disable_tuple_notation": False}

Read = Callable[[bytes], object]          # a body (no wire header) -> the value
Write = Callable[[bytearray, object], None]  # appends a value's body


def reader(writer_schema: Any, reader_schema: Any = None) -> Read:
    """Reads a body written with ``writer_schema`` into ``reader_schema``'s view (None:
    the writer's). Both are fastavro-parsed or plain schema documents."""
    if reader_schema == writer_schema:
        reader_schema = None
    named: dict[str, dict[str, Any]] = {"writer": {}, "reader": {}}
    writer = fastavro.parse_schema(writer_schema, named["writer"])
    target = fastavro.parse_schema(reader_schema, named["reader"]) if reader_schema else None
    stream = io.BytesIO
    if not compiled_entry_points():
        public = fastavro.schemaless_reader

        def read_public(body: bytes) -> object:
            return public(stream(body), writer, target)
        return read_public
    compiled, options = _compiled_read, dict(_READ_OPTIONS)

    def read(body: bytes) -> object:
        return compiled(stream(body), writer, named, target, options)
    return read


def writer(schema: Any) -> Write:
    """Appends the body of a value of ``schema`` to a bytearray."""
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(schema, named)
    if not compiled_entry_points():
        public = fastavro.schemaless_writer

        def write_public(out: bytearray, value: object) -> None:
            body = io.BytesIO()
            public(body, parsed, value)
            out += body.getbuffer()
        return write_public
    compiled, options = _compiled_write, dict(_WRITE_OPTIONS)

    def write(out: bytearray, value: object) -> None:
        compiled(out, value, parsed, named, "", options)
    return write


# A schema with the shapes whose handling the entry points' arguments steer: a named
# record nested and referenced by name, a union, a logical type, an enum, an array.
_PROBE_SCHEMA = {
    "type": "record", "name": "Probe", "namespace": "txstage.probe", "fields": [
        {"name": "id", "type": "long"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "inner", "type": ["null", {"type": "record", "name": "Inner", "fields": [
            {"name": "text", "type": "string"}]}]},
        {"name": "again", "type": ["null", "Inner"]},
        {"name": "tags", "type": {"type": "array", "items": "string"}}]}
_PROBE_VALUE = {"id": 7, "at": 1_700_000_000_000, "kind": "B", "inner": {"text": "x"},
                "again": None, "tags": ["a", "é"]}


@functools.cache
def compiled_entry_points() -> bool:
    """Whether fastavro's compiled entry points are here and give exactly what the
    public functions give (checked once, on a probe record)."""
    return _probe()


def _probe() -> bool:
    if _compiled_read is None or _compiled_write is None:
        return False
    try:
        named: dict[str, dict[str, Any]] = {"writer": {}, "reader": {}}
        parsed = fastavro.parse_schema(_PROBE_SCHEMA, named["writer"])
        public = io.BytesIO()
        fastavro.schemaless_writer(public, _PROBE_SCHEMA, _PROBE_VALUE)
        compiled = bytearray()
        _compiled_write(compiled, _PROBE_VALUE, parsed, named["writer"], "",
                        dict(_WRITE_OPTIONS))
        body = public.getvalue()
        return bytes(compiled) == body and _compiled_read(
            io.BytesIO(body), parsed, named, None, dict(_READ_OPTIONS)
        ) == fastavro.schemaless_reader(io.BytesIO(body), _PROBE_SCHEMA)
    except Exception:
        return False
