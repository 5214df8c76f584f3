"""One decoder and one encoder per format. A decoder takes the bytes read and gives the
transform its value; an encoder takes what the transform returned for a topic and gives
the bytes to write. Schemas are resolved once (by id when reading, by subject when
writing) and kept parsed: Avro as a reader or writer of its parsed schema
(service.formats.avro), JSON Schema with a compiled validator, protobuf with the message
class.

Python types (docs/formats.md): json and json_schema give and take what ``json.loads``
gives (dict, list, str, int, float, bool, None); avro gives and takes fastavro's (a record
is a dict; bytes, fixed: bytes; long: int; double: float; a logical type: its Python
type, e.g. datetime for timestamp-millis); protobuf gives and takes instances of the
configured message class. A key or value that is None (a tombstone) stays None.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka.schema_registry import Schema
from jsonschema.validators import validator_for  # type: ignore[import-untyped]

from service.formats import avro, wire
from service.formats.errors import OutputSchemaError, UndecodableError
from service.formats.registry import Registry, not_found

Decoder = Callable[[bytes], object]
Encoder = Callable[[str, object], bytes]
_TYPES = {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}


def decode_json(data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise UndecodableError(f"not JSON: {exc}") from exc


def encode_json(topic: str, value: object) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:
        raise OutputSchemaError(f"the output for {topic!r} is not JSON: {exc}") from exc


class RegistryDecoder:
    """A registry format's decoder: the writer's schema by id, once."""

    def __init__(self, fmt: str, registry: Registry, reader: Any = None) -> None:
        self.fmt, self.registry, self.reader = fmt, registry, reader
        self._parsed: dict[int, Any] = {}
        self.read = {"avro": self._avro, "json_schema": self._json,
                     "protobuf": self._protobuf}[fmt]

    def __call__(self, data: bytes) -> object:
        schema_id, payload = wire.split(data)
        parsed = self._parsed.get(schema_id, _MISSING)
        if parsed is _MISSING:
            parsed = self._writer(schema_id)
        try:
            return self.read(payload, parsed)
        except Exception as exc:
            raise self._undecodable(schema_id, exc) from exc

    def _undecodable(self, schema_id: int, exc: Exception) -> UndecodableError:
        return UndecodableError(f"the payload does not decode as {self.fmt} with schema "
                                f"{schema_id}: {type(exc).__name__}: {exc}")

    def function(self) -> Decoder:
        """The decoder to call per record: for Avro, one closure with a reader per
        schema id, found by the record's first five bytes (about 1 µs a record less than
        ``__call__``, 1 KB values), else ``self``."""
        if self.fmt != "avro":
            return self
        readers: dict[bytes, Callable[[bytes], object]] = {}
        parsed_by_id, writer_of, undecodable = self._parsed, self._writer, self._undecodable

        def reader_of(data: bytes) -> Callable[[bytes], object]:
            schema_id, _ = wire.split(data)  # raises when not the wire format
            read: Callable[[bytes], object] = parsed_by_id.get(schema_id) or writer_of(schema_id)
            readers[bytes(data[:wire.HEADER])] = read
            return read

        def decode_avro(data: bytes) -> object:
            read = readers.get(data[:5]) or reader_of(data)
            try:
                return read(data[5:])
            except Exception as exc:
                raise undecodable(int.from_bytes(data[1:5], "big"), exc) from exc
        return decode_avro

    def _writer(self, schema_id: int) -> Any:
        """The writer's schema of ``schema_id`` (Avro: a reader of its bodies)."""
        try:
            schema = self.registry.schema(schema_id)
        except Exception as exc:
            if not_found(exc):
                raise UndecodableError(f"unknown schema id {schema_id}: {exc}") from exc
            raise
        kind = schema.schema_type or "AVRO"
        if kind != _TYPES[self.fmt]:
            raise UndecodableError(f"schema id {schema_id} is {kind}, not {_TYPES[self.fmt]}")
        parsed = avro.reader(json.loads(schema.schema_str or ""), self.reader) \
            if self.fmt == "avro" else None
        self._parsed[schema_id] = parsed
        return parsed

    @staticmethod
    def _avro(payload: memoryview, read: Callable[[bytes], object]) -> object:
        return read(bytes(payload))

    def _json(self, payload: memoryview, _: object) -> object:
        return json.loads(bytes(payload))

    def _protobuf(self, payload: memoryview, _: object) -> object:
        return self.reader.FromString(bytes(wire.skip_message_indexes(payload)))


@dataclass(frozen=True)
class OutputSchema:
    """Where an output's schema comes from: ``text`` (a schema file, or a protobuf class's
    file descriptor), or None: the subject's latest registered version."""

    fmt: str
    text: str | None = None
    record_name: str | None = None  # the record/message name, for the record strategies
    message: Any = None  # protobuf: the message class
    auto_register: bool = False


class RegistryEncoder:
    """A registry format's encoder: per output topic, its subject's schema id, once."""

    def __init__(self, source: OutputSchema, registry: Registry, subject: Callable[[str], str]
                 ) -> None:
        self.source, self.registry, self.subject = source, registry, subject
        self._resolved: dict[str, tuple[bytes, Any]] = {}
        self.write = {"avro": self._avro, "json_schema": self._json,
                      "protobuf": self._protobuf}[source.fmt]

    def __call__(self, topic: str, value: object) -> bytes:
        resolved = self._resolved.get(topic)
        if resolved is None:
            resolved = self._resolve(topic)
        prefix, parsed = resolved
        try:
            return self.write(prefix, parsed, value)
        except Exception as exc:
            raise self._mismatch(topic, exc) from exc

    def _mismatch(self, topic: str, exc: Exception) -> OutputSchemaError:
        return OutputSchemaError(f"the output for {topic!r} does not match its "
                                 f"{self.source.fmt} schema ({self.subject(topic)}): "
                                 f"{type(exc).__name__}: {exc}")

    def function(self) -> Encoder:
        """The encoder to call per output: for Avro one closure, as ``RegistryDecoder``'s."""
        if self.source.fmt != "avro":
            return self
        resolved_by_topic, resolve, mismatch = self._resolved, self._resolve, self._mismatch

        def encode_avro(topic: str, value: object) -> bytes:
            resolved = resolved_by_topic.get(topic)
            if resolved is None:
                resolved = resolve(topic)
            out = bytearray(resolved[0])
            try:
                resolved[1](out, value)
            except Exception as exc:
                raise mismatch(topic, exc) from exc
            return bytes(out)
        return encode_avro

    def _resolve(self, topic: str) -> tuple[bytes, Any]:
        subject = self.subject(topic)
        try:
            schema_id, text = self.registry.cached(("subject", subject), f"subject {subject}",
                                                   lambda: self.registered(subject))
        except Exception as exc:
            if not not_found(exc):
                raise
            # Not cached: registered later, the subject is found at the next output.
            raise OutputSchemaError(f"subject {subject!r} has no schema registered (register "
                                    "it, or set TXSTAGE_REGISTRY_AUTO_REGISTER)") from exc
        prefix = wire.header(schema_id)
        parsed: Any = None
        if self.source.fmt == "avro":
            parsed = avro.writer(json.loads(text or ""))
        elif self.source.fmt == "json_schema":
            document = json.loads(text or "")
            parsed = validator_for(document)(document)
        else:
            prefix += wire.message_indexes(_index_path(self.source.message.DESCRIPTOR))
        self._resolved[topic] = prefix, parsed
        return prefix, parsed

    def registered(self, subject: str) -> tuple[int, str | None]:
        """``(id, schema text)`` under ``subject``: the configured schema's (registered
        first when auto-registration is on), or the latest version (its 404 when none)."""
        client, source = self.registry.client, self.source
        if source.text is None:
            latest = client.get_latest_version(subject)
            return int(latest.schema_id or 0), latest.schema.schema_str
        schema = Schema(source.text, _TYPES[source.fmt])
        try:
            return int(client.lookup_schema(subject, schema).schema_id or 0), source.text
        except Exception as exc:
            if not (not_found(exc) and source.auto_register):
                raise
            return int(client.register_schema(subject, schema)), source.text

    @staticmethod
    def _avro(prefix: bytes, write: Any, value: object) -> bytes:
        out = bytearray(prefix)
        write(out, value)
        return bytes(out)

    @staticmethod
    def _json(prefix: bytes, validator: Any, value: object) -> bytes:
        validator.validate(value)
        return prefix + json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    def _protobuf(self, prefix: bytes, _: object, value: object) -> bytes:
        message = self.source.message
        if not isinstance(value, message):
            raise TypeError(f"a {type(value).__name__}, not a {message.__name__}")
        return prefix + bytes(value.SerializeToString())


def _index_path(descriptor: Any) -> list[int]:
    """A message's place in its file: its index among the file's messages, then among
    each enclosing message's nested ones."""
    path: list[int] = []
    while descriptor.containing_type is not None:
        parent = descriptor.containing_type
        path.append(list(parent.nested_types).index(descriptor))
        descriptor = parent
    path.append(list(descriptor.file.message_types_by_name.values()).index(descriptor))
    return path[::-1]


_MISSING = object()
