"""``with_formats(transform, build(settings, ...), output_topic)``: the transform on
decoded keys and values, its outputs encoded; the one wrapper the stage, the backfill and
the tools call ``processing.process`` with. All four formats ``bytes``: the transform
itself."""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro

from service.contract.records import Output, Record, Transform
from service.errors import ConfigError
from service.format_settings import FormatSettings
from service.formats.codecs import (
    Decoder,
    Encoder,
    OutputSchema,
    RegistryDecoder,
    RegistryEncoder,
    decode_json,
    encode_json,
)
from service.formats.registry import Registry


@dataclass
class Codecs:
    """The decoders and encoders the settings name (None: bytes, as they are)."""

    input_key: Decoder | None
    input_value: Decoder | None
    output_key: Encoder | None
    output_value: Encoder | None
    registry: Registry | None
    # output_key / output_value -> its registry encoder (what check-config asks about)
    encoders: dict[str, RegistryEncoder] = field(default_factory=dict)

    @property
    def identity(self) -> bool:
        return not (self.input_key or self.input_value or self.output_key or self.output_value)


def build(settings: FormatSettings, transform_ref: str, registry: Registry | None = None
          ) -> Codecs:
    """The codecs of ``settings``; raises ConfigError naming a schema it cannot read
    (schema files are looked for here, then beside ``transform_ref``'s module)."""
    if registry is None and settings.uses_registry:
        registry = Registry(settings)
    found: dict[str, Any] = {}
    encoders: dict[str, RegistryEncoder] = {}
    for part, fmt in settings.formats.items():
        schema_ref: str = getattr(settings, f"{part}_schema")
        name = "key" if part.endswith("key") else "value"
        if fmt == "bytes":
            found[part] = None
        elif fmt == "json":
            found[part] = decode_json if part.startswith("input") else encode_json
        elif part.startswith("input"):
            assert registry is not None
            found[part] = RegistryDecoder(fmt, registry, _reader(
                fmt, schema_ref, transform_ref, f"TXSTAGE_{part.upper()}_SCHEMA")).function()
        else:
            assert registry is not None
            source = output_schema(settings, part, transform_ref)
            encoders[part] = RegistryEncoder(source, registry, subject_namer(
                settings, name, source.record_name))
            found[part] = encoders[part].function()
    return Codecs(found["input_key"], found["input_value"], found["output_key"],
                  found["output_value"], registry, encoders)


def with_formats(transform: Transform, codecs: Codecs, default_topic: str) -> Transform:
    """``transform`` seeing decoded keys and values and returning values to encode
    (for ``default_topic`` when an output names no topic)."""
    if codecs.identity:
        return transform
    in_key, in_value = codecs.input_key, codecs.input_value
    out_key, out_value = codecs.output_key, codecs.output_value

    def formatted(record: Record) -> Iterable[Output]:
        key, value = record.key, record.value
        decoded = Record(record.topic, record.partition, record.offset, record.timestamp,
                         key if in_key is None or key is None else in_key(key),  # type: ignore[arg-type]
                         value if in_value is None or value is None else in_value(value),  # type: ignore[arg-type]
                         record.headers)
        encoded = []
        for out in transform(decoded):
            if not isinstance(out, Output):
                raise TypeError(f"the transform yielded a {type(out).__name__}, "
                                "not service.Output")
            topic = out.topic or default_topic
            okey, ovalue = out.key, out.value
            if out_key is not None and okey is not None:
                okey = out_key(topic, okey)
            if out_value is not None and ovalue is not None:
                ovalue = out_value(topic, ovalue)
            encoded.append(Output(ovalue, okey, out.topic, out.headers))
        return encoded

    formatted.__wrapped__ = transform  # type: ignore[attr-defined]
    return formatted


def subject_namer(settings: FormatSettings, field: str, record_name: str | None
                  ) -> Callable[[str], str]:
    """topic -> subject, by ``TXSTAGE_SUBJECT_NAME_STRATEGY`` (Confluent's three)."""
    strategy = settings.subject_name_strategy
    if strategy == "topic":
        return lambda topic: f"{topic}-{field}"
    if record_name is None:
        raise ConfigError(f"TXSTAGE_SUBJECT_NAME_STRATEGY={strategy}: needs the output "
                          f"{field}'s schema (a schema file or class) for its record name")
    if strategy == "record":
        return lambda topic: record_name
    return lambda topic: f"{topic}-{record_name}"


def output_schema(settings: FormatSettings, part: str, transform_ref: str) -> OutputSchema:
    fmt: str = settings.formats[part]
    ref: str = getattr(settings, f"{part}_schema")
    auto = settings.registry_auto_register
    if fmt == "protobuf":
        message = import_class(ref, f"TXSTAGE_{part.upper()}_SCHEMA")
        return OutputSchema(fmt, _proto_text(message), message.DESCRIPTOR.full_name, message,
                            auto)
    if not ref:
        return OutputSchema(fmt, auto_register=auto)
    text = schema_file(ref, transform_ref, f"TXSTAGE_{part.upper()}_SCHEMA").read_text()
    document = _json_document(text, ref)
    parsed: Any = fastavro.parse_schema(document) if fmt == "avro" else document
    name = parsed.get("name" if fmt == "avro" else "title") if isinstance(parsed, dict) else None
    return OutputSchema(fmt, text, name, None, auto)


def _reader(fmt: str, ref: str, transform_ref: str, name: str) -> Any:
    if fmt == "protobuf":
        return import_class(ref, name)
    if fmt == "avro" and ref:
        text = schema_file(ref, transform_ref, name).read_text()
        return fastavro.parse_schema(_json_document(text, ref))
    return None


def _json_document(text: str, ref: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"schema file {ref}: not JSON: {exc}") from exc


def schema_file(ref: str, transform_ref: str, setting: str) -> Path:
    """``ref`` as a path, or beside the transform's module (a schema file in its package)."""
    path = Path(ref)
    if path.is_file():
        return path
    module = transform_ref.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        beside = Path(spec.origin).parent / ref
        if beside.is_file():
            return beside
    raise ConfigError(f"{setting}={ref}: no such file (here or beside {module or 'the transform'})")


def import_class(ref: str, setting: str) -> Any:
    module_name, _, name = ref.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in name.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{setting}={ref}: cannot load the message class: {exc}") from exc
    if not hasattr(target, "DESCRIPTOR"):
        raise ConfigError(f"{setting}={ref}: not a protobuf message class")
    return target


def _proto_text(message: Any) -> str:
    """The schema text confluent-kafka's own ProtobufSerializer registers for the class
    (its file descriptor, serialized): the same text finds the same registered id."""
    from confluent_kafka.schema_registry.common.protobuf import _schema_to_str

    return str(_schema_to_str(message.DESCRIPTOR.file))
