"""Parity: do two sets of outputs hold the same records, matched by lineage?

Outputs are keyed by (``txstage.src``, ``txstage.idx``) and must agree on topic, key,
value and every header (lineage included, in order). The report lists outputs missing
from the actual side, extra ones, different ones (naming the fields), duplicates on
either side (an exactly-once violation), and outputs with no lineage. Either side is
topics (read read_committed to the end) or a Parquet output of the backfill.

Content is kept as 16-byte digests, so a few million outputs fit in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from service import lineage
from service.backfill.plan import Slice
from service.backfill.specs import ParquetSink, parse_sink
from service.errors import ConfigError
from service.lineage import Lineage
from service.verify import read_topics

Key = tuple[str, int]  # (txstage.src, txstage.idx)
FIELDS = ("topic", "key", "value", "headers")


@dataclass(frozen=True, slots=True)
class Output:
    """One output as read back from a topic or a Parquet file."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass(slots=True)
class ParityReport:
    expected: int = 0
    actual: int = 0
    missing: list[Key] = field(default_factory=list)
    extra: list[Key] = field(default_factory=list)
    different: list[tuple[Key, tuple[str, ...]]] = field(default_factory=list)
    duplicated_expected: list[Key] = field(default_factory=list)
    duplicated_actual: list[Key] = field(default_factory=list)
    unstamped_expected: int = 0
    unstamped_actual: int = 0

    def problems(self) -> list[str]:
        listed: list[tuple[str, Sequence[object]]] = [
            ("missing from the actual outputs", self.missing),
            ("extra in the actual outputs", self.extra),
            ("different (fields)", self.different),
            ("duplicated in the actual outputs", self.duplicated_actual),
            ("duplicated in the expected outputs", self.duplicated_expected),
        ]
        found = [f"{what}: {len(items)}, e.g. {list(items[:5])}" for what, items in listed
                 if items]
        found += [f"outputs without lineage headers ({side}): {count}" for side, count in
                  (("expected", self.unstamped_expected), ("actual", self.unstamped_actual))
                  if count]
        return found

    @property
    def ok(self) -> bool:
        return not self.problems()


_Digest = tuple[str, bytes, bytes, bytes]


def compare(expected: Iterable[Output], actual: Iterable[Output], *,
            rename: Mapping[str, str] | None = None,
            within: Callable[[Lineage], bool] | None = None) -> ParityReport:
    """Compare by lineage. ``rename`` maps expected topic names to actual ones (a backfill
    writing to other topics than the stream); ``within`` keeps only outputs whose input
    it accepts (e.g. the input range of a backfill job)."""
    report = ParityReport()
    want, report.duplicated_expected, report.unstamped_expected, report.expected = \
        _index(expected, rename or {}, within)
    got, report.duplicated_actual, report.unstamped_actual, report.actual = \
        _index(actual, {}, within)
    report.missing = sorted(k for k in want if k not in got)
    report.extra = sorted(k for k in got if k not in want)
    report.different = sorted((k, _fields(want[k], got[k])) for k in want
                              if k in got and want[k] != got[k])
    return report


def _index(outputs: Iterable[Output], rename: Mapping[str, str],
           within: Callable[[Lineage], bool] | None
           ) -> tuple[dict[Key, _Digest], list[Key], int, int]:
    found: dict[Key, _Digest] = {}
    duplicates: list[Key] = []
    unstamped = count = 0
    for out in outputs:
        tag = lineage.read(out.headers)
        if tag is None:
            unstamped += 1
            continue
        if within is not None and not within(tag):
            continue
        count += 1
        key = (f"{tag.topic}/{tag.partition}/{tag.offset}", tag.idx)
        if key in found:
            duplicates.append(key)
        found[key] = _digest(out, rename)
    return found, duplicates, unstamped, count


def _digest(out: Output, rename: Mapping[str, str]) -> _Digest:
    headers = b"".join(_hash(name.encode()) + _hash(value) for name, value in out.headers)
    return (rename.get(out.topic, out.topic), _hash(out.key), _hash(out.value),
            _hash(headers))


def _hash(data: bytes | None) -> bytes:
    if data is None:
        return b"\x00" * 16
    return b"\x01" + hashlib.blake2b(data, digest_size=15).digest()


def _fields(a: _Digest, b: _Digest) -> tuple[str, ...]:
    return tuple(name for name, x, y in zip(FIELDS, a, b, strict=True) if x != y)


# -- reading outputs back ----------------------------------------------------------------


def from_topics(bootstrap: str, topics: Iterable[str], timeout_s: float = 120.0
                ) -> Iterator[Output]:
    """Every record of ``topics``, read_committed to the end (service.verify.read_topics)."""
    for record in read_topics(bootstrap, topics, timeout_s=timeout_s):
        yield Output(record.topic, record.key, record.value, record.headers)


def from_parquet(path: str) -> Iterator[Output]:
    """The rows of a Parquet sink's output (its topic, key, value and headers columns)."""
    import pyarrow.dataset as ds

    dataset = ds.dataset(path, format="parquet")
    for batch in dataset.to_batches(columns=list(FIELDS)):
        for row in batch.to_pylist():
            headers = tuple((h["key"], h["value"] or b"") for h in row["headers"] or ())
            yield Output(row["topic"], row["key"], row["value"], headers)


def read(where: str, bootstrap: str | None) -> Iterator[Output]:
    """``kafka://topic[,topic...]`` or ``parquet:<path>``."""
    if where.startswith("kafka://"):
        topics = [t for t in where.removeprefix("kafka://").split(",") if t]
        if not topics:
            raise ConfigError(f"{where!r}: name the topics: kafka://<topic>[,<topic>...]")
        if not bootstrap:
            raise ConfigError(f"{where!r} needs TXSTAGE_BOOTSTRAP_SERVERS or "
                              f"--bootstrap-servers")
        return from_topics(bootstrap, topics)
    sink = parse_sink(where)
    if not isinstance(sink, ParquetSink):
        raise ConfigError(f"{where!r}: compare kafka://<topics> or parquet:<path>")
    return from_parquet(sink.path)


def within_slices(slices: Iterable[Slice]) -> Callable[[Lineage], bool]:
    """Accept outputs of inputs inside ``slices`` (a job's plan)."""
    by_partition: dict[tuple[str, int], list[Slice]] = {}
    for piece in slices:
        by_partition.setdefault((piece.topic, piece.partition), []).append(piece)

    def accept(tag: Lineage) -> bool:
        return any(s.contains(tag.offset) for s in by_partition.get((tag.topic, tag.partition),
                                                                     ()))

    return accept
