"""What to read and where to write, as the operator names them on the command line.

Sources::

    kafka://<topic>[?from=<bound>][&to=<bound>]     from defaults to earliest, to to latest
        <bound> = earliest | latest | offsets:<partition>=<offset>,... | timestamp:<ms or ISO-8601>
    parquet:<path>        files with the fields of service.Record (see docs/backfill.md)
    jsonl:<path>[?encoding=utf8|base64]

Sinks::

    kafka[://<topic>]     the default output topic (else --output-topic / TXSTAGE_OUTPUT_TOPIC)
    parquet:<path>

``<path>`` is ``///absolute/path``, ``relative/path`` or another URI Spark reads
(``s3a://bucket/key``, ``hdfs://nn/path``). Parsing is pure: nothing here talks to
Kafka or Spark, and every problem is a ConfigError (exit code 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal
from urllib.parse import parse_qsl

from service.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Earliest:
    def __str__(self) -> str:
        return "earliest"


@dataclass(frozen=True, slots=True)
class Latest:
    def __str__(self) -> str:
        return "latest"


@dataclass(frozen=True, slots=True)
class Offsets:
    """Explicit offsets; the partitions named are the partitions read."""

    by_partition: Mapping[int, int]

    def __str__(self) -> str:
        return "offsets:" + ",".join(f"{p}={o}" for p, o in sorted(self.by_partition.items()))


@dataclass(frozen=True, slots=True)
class Timestamp:
    """The first offset whose record timestamp is at or after ``ms``."""

    ms: int

    def __str__(self) -> str:
        return f"timestamp:{self.ms}"


Bound = Earliest | Latest | Offsets | Timestamp


@dataclass(frozen=True, slots=True)
class KafkaSource:
    """A committed range of a topic: ``start`` inclusive, ``end`` exclusive."""

    topic: str
    start: Bound = field(default_factory=Earliest)
    end: Bound = field(default_factory=Latest)

    def partitions(self) -> frozenset[int] | None:
        """The partitions named by offset bounds; ``None`` means every partition."""
        named = [b.by_partition.keys() for b in (self.start, self.end) if isinstance(b, Offsets)]
        return frozenset().union(*named) if named else None

    def __str__(self) -> str:
        return f"kafka://{self.topic}?from={self.start}&to={self.end}"


FileFormat = Literal["parquet", "jsonl"]
Encoding = Literal["utf8", "base64"]


@dataclass(frozen=True, slots=True)
class FileSource:
    format: FileFormat
    path: str
    encoding: Encoding = "utf8"  # how jsonl holds key, value and header values

    def __str__(self) -> str:
        suffix = f"?encoding={self.encoding}" if self.format == "jsonl" else ""
        return f"{self.format}:{self.path}{suffix}"


Source = KafkaSource | FileSource


@dataclass(frozen=True, slots=True)
class KafkaSink:
    topic: str | None = None  # None: --output-topic / TXSTAGE_OUTPUT_TOPIC

    def __str__(self) -> str:
        return f"kafka://{self.topic}" if self.topic else "kafka"


@dataclass(frozen=True, slots=True)
class ParquetSink:
    path: str

    def __str__(self) -> str:
        return f"parquet:{self.path}"


Sink = KafkaSink | ParquetSink

_SOURCE_SCHEMES = ("kafka", "parquet", "jsonl")


def parse_source(text: str) -> Source:
    scheme, rest = _scheme(text, _SOURCE_SCHEMES, "source")
    if scheme == "kafka":
        return _kafka_source(text, rest)
    location, query = _split_query(rest)
    params = _params(text, query, allowed=("encoding",) if scheme == "jsonl" else ())
    path = _location(text, location)
    if scheme == "parquet":
        return FileSource("parquet", path)
    encoding = params.get("encoding", "utf8")
    if encoding not in ("utf8", "base64"):
        raise ConfigError(f"source {text!r}: encoding must be utf8 or base64, not {encoding!r}")
    return FileSource("jsonl", path, "base64" if encoding == "base64" else "utf8")


def parse_sink(text: str) -> Sink:
    if text in ("kafka", "kafka:", "kafka://"):
        return KafkaSink()
    scheme, rest = _scheme(text, ("kafka", "parquet"), "sink")
    if scheme == "kafka":
        topic, query = _split_query(rest.removeprefix("//"))
        if query or "/" in topic:
            raise ConfigError(f"sink {text!r}: write kafka or kafka://<topic>")
        return KafkaSink(topic or None)
    location, query = _split_query(rest)
    _params(text, query, allowed=())
    return ParquetSink(_location(text, location))


def _scheme(text: str, schemes: tuple[str, ...], what: str) -> tuple[str, str]:
    scheme, sep, rest = text.partition(":")
    if not sep or scheme not in schemes:
        raise ConfigError(
            f"{what} {text!r}: unknown scheme {scheme if sep else ''!r}; "
            f"use one of {', '.join(s + ':' for s in schemes)}"
        )
    return scheme, rest


def _split_query(rest: str) -> tuple[str, str]:
    location, _, query = rest.partition("?")
    return location, query


def _params(text: str, query: str, allowed: tuple[str, ...]) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(f"{text!r}: cannot parse the query {query!r}") from None
    params: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            expected = ", ".join(allowed) if allowed else "none"
            raise ConfigError(f"{text!r}: unknown parameter {name!r} (expected: {expected})")
        if name in params:
            raise ConfigError(f"{text!r}: parameter {name!r} is given twice")
        params[name] = value
    return params


def _location(text: str, location: str) -> str:
    """``///abs`` → ``/abs``; ``rel/path`` and ``s3a://…`` are kept as they are."""
    if location.startswith("///"):
        return location[2:]
    if location.startswith("//") or not location:
        raise ConfigError(
            f"{text!r}: name a path: <scheme>:///absolute/path, <scheme>:relative/path "
            f"or <scheme>:s3a://bucket/key"
        )
    return location


def _kafka_source(text: str, rest: str) -> KafkaSource:
    if not rest.startswith("//"):
        raise ConfigError(f"source {text!r}: write kafka://<topic>?from=...&to=...")
    topic, query = _split_query(rest[2:])
    if not topic or "/" in topic:
        raise ConfigError(f"source {text!r}: the topic is missing (kafka://<topic>)")
    params = _params(text, query, allowed=("from", "to"))
    start = parse_bound(params.get("from", "earliest"), "from")
    end = parse_bound(params.get("to", "latest"), "to")
    source = KafkaSource(topic, start, end)
    check_order(source)
    return source


def parse_bound(text: str, name: str) -> Bound:
    kind, _, arg = text.partition(":")
    if text == "earliest":
        return Earliest()
    if text == "latest":
        return Latest()
    if kind == "offsets" and arg:
        return Offsets(_offsets(arg, name))
    if kind == "timestamp" and arg:
        return Timestamp(_timestamp(arg, name))
    raise ConfigError(
        f"{name}={text!r}: expected earliest, latest, offsets:<partition>=<offset>,... "
        f"or timestamp:<epoch ms | ISO-8601 with a time zone>"
    )


def _offsets(arg: str, name: str) -> dict[int, int]:
    found: dict[int, int] = {}
    for item in arg.split(","):
        partition, sep, offset = item.partition("=")
        if not (sep and partition.strip().isdigit() and offset.strip().isdigit()):
            raise ConfigError(f"{name}=offsets:{arg}: {item!r} is not <partition>=<offset>")
        if int(partition) in found:
            raise ConfigError(f"{name}=offsets:{arg}: partition {int(partition)} is given twice")
        found[int(partition)] = int(offset)
    return found


def _timestamp(arg: str, name: str) -> int:
    if arg.lstrip("-").isdigit():
        return int(arg)
    try:
        moment = datetime.fromisoformat(arg)
    except ValueError:
        raise ConfigError(f"{name}=timestamp:{arg}: not epoch milliseconds or ISO-8601") from None
    if moment.tzinfo is None:
        raise ConfigError(f"{name}=timestamp:{arg}: give a time zone (e.g. Z or +02:00)")
    return round(moment.timestamp() * 1000)


def check_order(source: KafkaSource) -> None:
    """Reject an end before its start where the bounds alone say so (before any I/O)."""
    start, end = source.start, source.end
    if isinstance(start, Latest) and isinstance(end, Earliest):
        raise ConfigError(f"source {source}: the end (earliest) is before the start (latest)")
    if isinstance(start, Timestamp) and isinstance(end, Timestamp) and end.ms < start.ms:
        raise ConfigError(f"source {source}: the end timestamp {end.ms} is before the start "
                          f"timestamp {start.ms}")
    if isinstance(start, Offsets) and isinstance(end, Offsets):
        if start.by_partition.keys() != end.by_partition.keys():
            raise ConfigError(f"source {source}: from and to must name the same partitions")
        for partition, offset in sorted(start.by_partition.items()):
            if end.by_partition[partition] < offset:
                raise ConfigError(
                    f"source {source}: partition {partition} ends at offset "
                    f"{end.by_partition[partition]}, before its start {offset}"
                )
