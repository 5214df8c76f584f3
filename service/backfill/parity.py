"""Parity: do two sets of outputs hold the same records, matched by lineage?

Outputs are keyed by (``txstage.src``, ``txstage.idx``) and must agree on topic, key,
value and every header (lineage included, in order). The report lists outputs missing
from the actual side, extra ones, different ones (naming the fields), keys that are a
dead letter on one side and an output on the other, duplicates on either side (an
exactly-once violation), and outputs with no lineage. Either side is topics (read
read_committed to the end) or a Parquet output of the backfill.

Redrive lineage is read as ``txstage audit`` reads it (service/tools/audit/ledger.py). After
``txstage redrive``, a stream holds for one input its dead letter and the outputs
redrive wrote in its place (marked ``txstage.redriven``), or letters of several attempts
(``txstage.redrive.attempt``, the last one perhaps parked); a backfill of the fixed
transform holds just the outputs, or one letter. Per key the latest generation stands:
redriven outputs replace the input's letters, a letter of a later attempt the earlier
ones; the replaced letters are counted, not compared. Two records of one key in one
generation, or outputs beside a letter, are still duplicates. The marks redrive appends
after the lineage headers are not compared: they record how a record came to be
written, which a backfill that writes it once cannot repeat.

Content is kept as 16-byte digests, so a few million outputs fit in memory.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from service.backfill.plan import Slice
from service.backfill.specs import ParquetSink, parse_sink
from service.contract import letters, lineage
from service.contract.lineage import Lineage
from service.errors import ConfigError
from service.kafka.reading import read_topics

Key = tuple[str, int]  # (txstage.src, txstage.idx)
FIELDS = ("topic", "key", "value", "headers")
EXAMPLES = 5  # per kind of difference, in the report

# The kinds of difference, in the order the report lists them: ParityReport's list
# fields and their words.
_KINDS = (
    ("missing", "missing"),
    ("extra", "extra"),
    ("different", "different"),
    ("dead_lettered_expected", "dead-lettered in expected only"),
    ("dead_lettered_actual", "dead-lettered in actual only"),
    ("duplicated_expected", "duplicated in expected"),
    ("duplicated_actual", "duplicated in actual"),
)


@dataclass(frozen=True, slots=True)
class Output:
    """One output as read back from a topic or a Parquet file."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass(slots=True)
class Reconciled:
    """Dead letters of one side that a later generation of their input replaced."""

    by_redriven: int = 0  # by the outputs txstage redrive wrote in their place
    by_later_attempt: int = 0  # by the letter redrive wrote again (or parked)

    def __bool__(self) -> bool:
        return bool(self.by_redriven or self.by_later_attempt)

    def describe(self) -> str:
        redriven, later = self.by_redriven, self.by_later_attempt
        by_redriven = f"replaced by {'its' if redriven == 1 else 'their'} redriven outputs"
        if redriven and later:
            return f"{_plural(redriven, 'letter')} {by_redriven}, {later} by a later attempt"
        if redriven:
            return f"{_plural(redriven, 'letter')} {by_redriven}"
        return f"{_plural(later, 'letter')} replaced by a later attempt"


@dataclass(slots=True)
class ParityReport:
    expected: int = 0  # outputs read (within the range), replaced letters included
    actual: int = 0
    matching: int = 0  # keys whose standing records are equal on both sides
    missing: list[Key] = field(default_factory=list)
    extra: list[Key] = field(default_factory=list)
    different: list[tuple[Key, tuple[str, ...]]] = field(default_factory=list)
    # A letter on this side where the other has an output: e.g. not redriven yet.
    dead_lettered_expected: list[Key] = field(default_factory=list)
    dead_lettered_actual: list[Key] = field(default_factory=list)
    duplicated_expected: list[Key] = field(default_factory=list)  # one per extra copy
    duplicated_actual: list[Key] = field(default_factory=list)
    unstamped_expected: int = 0
    unstamped_actual: int = 0
    reconciled_expected: Reconciled = field(default_factory=Reconciled)
    reconciled_actual: Reconciled = field(default_factory=Reconciled)

    def counts(self) -> dict[str, int]:
        found = {name: len(getattr(self, name)) for name, _ in _KINDS}
        found["unstamped_expected"] = self.unstamped_expected
        found["unstamped_actual"] = self.unstamped_actual
        return found

    @property
    def ok(self) -> bool:
        return not any(self.counts().values())

    def problems(self) -> list[str]:
        """One line per kind of difference found: how many, and a few examples."""
        found = []
        for name, words in _KINDS:
            count = len(getattr(self, name))
            if not count:
                continue
            line = f"{words} {count}"
            fields = self.different_fields() if name == "different" else ()
            if fields:
                line += f" ({', '.join(fields)})"
            shown = [_where(key) + (f" ({', '.join(more)})" if len(fields) > 1 else "")
                     for key, more in self._examples(name)]
            found.append(f"{line}, e.g. {', '.join(shown)}")
        found += [f"without lineage in {side} {count}" for side, count in
                  (("expected", self.unstamped_expected), ("actual", self.unstamped_actual))
                  if count]
        return found

    def lines(self) -> list[str]:
        """The report for a person: the verdict, then what differs, what was read and
        what redrive lineage was reconciled."""
        problems = self.problems()
        match = f"{_plural(self.matching, 'output')} {'matches' if self.matching == 1 else 'match'}"
        head = f"DIFFERENT: {_plural(sum(self.counts().values()), 'difference')}; {match}" \
            if problems else f"EQUAL: {match}"
        found = [head, *(f"  {problem}" for problem in problems),
                 f"  read {self.expected} expected outputs, {self.actual} actual"]
        found += [f"  redrive ({side}): {reconciled.describe()}" for side, reconciled in
                  (("expected", self.reconciled_expected), ("actual", self.reconciled_actual))
                  if reconciled]
        return found

    def as_dict(self) -> dict[str, Any]:
        """The report for a machine (``--json``)."""
        return {
            "verdict": "EQUAL" if self.ok else "DIFFERENT",
            "matching": self.matching, "expected": self.expected, "actual": self.actual,
            "counts": self.counts(), "different_fields": list(self.different_fields()),
            "examples": {name: [{"input": key[0], "output": key[1]}
                                | ({"fields": list(fields)} if name == "different" else {})
                                for key, fields in self._examples(name)]
                         for name, _ in _KINDS},
            "redrive": {"expected": asdict(self.reconciled_expected),
                        "actual": asdict(self.reconciled_actual)},
        }

    def different_fields(self) -> tuple[str, ...]:
        seen = {name for _, fields in self.different for name in fields}
        return tuple(name for name in FIELDS if name in seen)

    def _examples(self, kind: str) -> list[tuple[Key, tuple[str, ...]]]:
        if kind == "different":
            return self.different[:EXAMPLES]
        keys: list[Key] = getattr(self, kind)
        return [(key, ()) for key in list(dict.fromkeys(keys))[:EXAMPLES]]


def _where(key: Key) -> str:
    return f"{key[0]} output {key[1]}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# A record's generation, the order in which its input's records replace each other: an
# output of the stage or a backfill; a dead letter, 1 + its redrive attempt; an output
# txstage redrive wrote in place of the letters.
_OUTPUT = 0
_REDRIVEN = 1 << 62
# Redrive's marks: txstage.redriven, and under the prefix its attempt count, its parking
# mark and whatever else it may come to add.
_MARKS = (lineage.REDRIVEN, "txstage.redrive.")
_ERROR = "txstage.error."  # the headers service/contract/deadletter.py gives a letter

_Entry = tuple[int, str, bytes, bytes, bytes]  # the generation, then FIELDS' digests


def compare(expected: Iterable[Output], actual: Iterable[Output], *,
            rename: Mapping[str, str] | None = None,
            within: Callable[[Lineage], bool] | None = None) -> ParityReport:
    """Compare by lineage. ``rename`` maps expected topic names to actual ones (a backfill
    writing to other topics than the stream); ``within`` keeps only outputs whose input
    it accepts (e.g. the input range of a backfill job)."""
    report = ParityReport()
    want_side, got_side = _Side(rename or {}, within), _Side({}, within)
    for out in expected:
        want_side.add(out)
    for out in actual:
        got_side.add(out)
    want, report.duplicated_expected, report.reconciled_expected = want_side.settle()
    got, report.duplicated_actual, report.reconciled_actual = got_side.settle()
    report.expected, report.unstamped_expected = want_side.read, want_side.unstamped
    report.actual, report.unstamped_actual = got_side.read, got_side.unstamped
    for key, a in want.items():
        b = got.get(key)
        if b is None:
            report.missing.append(key)
        elif _is_letter(a) != _is_letter(b):
            (report.dead_lettered_expected if _is_letter(a)
             else report.dead_lettered_actual).append(key)
        elif a[1:] != b[1:]:
            report.different.append((key, _fields(a, b)))
        else:
            report.matching += 1
    report.extra = [key for key in got if key not in want]
    for keys in (report.missing, report.extra, report.dead_lettered_expected,
                 report.dead_lettered_actual, report.duplicated_expected,
                 report.duplicated_actual):
        keys.sort(key=_order)
    report.different.sort(key=lambda item: _order(item[0]))
    return report


class _Side:
    """One side's records, settled to the one that stands for each key."""

    def __init__(self, rename: Mapping[str, str],
                 within: Callable[[Lineage], bool] | None) -> None:
        self.rename, self.within = rename, within
        self.first: dict[Key, _Entry] = {}
        self.more: dict[Key, list[_Entry]] = {}  # keys read again: few, unless duplicated
        self.lettered: set[Key] = set()  # keys with a dead letter: few, settled at the end
        self.redriven: set[str] = set()  # inputs (txstage.src) with redriven outputs
        self.read = self.unstamped = 0

    def add(self, out: Output) -> None:
        tag = lineage.read(out.headers)
        if tag is None:
            self.unstamped += 1
            return
        if self.within is not None and not self.within(tag):
            return
        self.read += 1
        src = f"{tag.topic}/{tag.partition}/{tag.offset}"
        key = (src, tag.idx)
        content, marks = _split_marks(out.headers)
        generation = _generation(out, content, marks)
        if generation == _REDRIVEN:
            self.redriven.add(src)
        elif generation != _OUTPUT:
            self.lettered.add(key)
        entry = (generation, *_digest(out, content, self.rename))
        if key in self.first:
            self.more.setdefault(key, []).append(entry)
        else:
            self.first[key] = entry

    def settle(self) -> tuple[dict[Key, _Entry], list[Key], Reconciled]:
        """The standing record per key, the duplicates and the letters replaced. Decided
        once everything is read: topics are read in no particular order, and a
        redriven output may come before the letter it replaces."""
        standing, duplicates, reconciled = self.first, [], Reconciled()
        for key in self.more.keys() | self.lettered:
            entries = [standing[key], *self.more.get(key, ())]
            generations = Counter(entry[0] for entry in entries)
            duplicates += [key] * sum(count - 1 for count in generations.values())
            if _OUTPUT in generations:
                # The stage wrote outputs for an input it also dead-lettered (or redrive
                # wrote them again): nothing replaces those, as in txstage audit.
                if len(generations) > 1:
                    duplicates.append(key)
                standing[key] = next(e for e in entries if e[0] == _OUTPUT)
                continue
            latest = max(generations)
            replaced = sum(count for g, count in generations.items() if g != latest)
            if latest != _REDRIVEN and key[0] in self.redriven:
                # Its redriven outputs were read under other indexes only (the one in its
                # place went to a topic not compared): they replace it all the same.
                del standing[key]
                reconciled.by_redriven += len(entries)
                continue
            if latest == _REDRIVEN:
                reconciled.by_redriven += replaced
            else:
                reconciled.by_later_attempt += replaced
            standing[key] = next(e for e in entries if e[0] == latest)
        return standing, duplicates, reconciled


def _split_marks(headers: tuple[tuple[str, bytes], ...]
                 ) -> tuple[tuple[tuple[str, bytes], ...], tuple[tuple[str, bytes], ...]]:
    """The headers before redrive's marks, and the marks. Only those after the lineage
    headers are this stage's redrive's: the same names among an output's own headers
    (copied from an input of another stage) are content."""
    end = len(headers)
    while end and headers[end - 1][0].startswith(_MARKS):
        end -= 1
    if end == len(headers):  # most outputs: no copy
        return headers, ()
    return headers[:end], headers[end:]


def _generation(out: Output, content: tuple[tuple[str, bytes], ...],
                marks: tuple[tuple[str, bytes], ...]) -> int:
    # Redrive's own reading of a letter, by the headers the stage appends (its
    # coordinates do not matter here); only for a record with an error header just
    # before the lineage, which an ordinary output does not have.
    if len(content) > 2 and content[-3][0].startswith(_ERROR) and \
            letters.parse(out.topic, 0, 0, 0, out.key, out.value, content) is not None:
        attempt = dict(marks).get(lineage.REDRIVE_ATTEMPT, b"0")
        try:
            return 1 + min(max(int(attempt), 0), _REDRIVEN - 2)
        except ValueError:
            return 1
    return _REDRIVEN if any(name == lineage.REDRIVEN for name, _ in marks) else _OUTPUT


def _is_letter(entry: _Entry) -> bool:
    return _OUTPUT < entry[0] < _REDRIVEN


def _order(key: Key) -> tuple[str, int, int, int]:
    """Input partitions and offsets in number order (``in/0/9`` before ``in/0/10``)."""
    topic, partition, offset = key[0].rsplit("/", 2)
    return topic, int(partition), int(offset), key[1]


def _digest(out: Output, headers: tuple[tuple[str, bytes], ...],
            rename: Mapping[str, str]) -> tuple[str, bytes, bytes, bytes]:
    joined = b"".join(_hash(name.encode()) + _hash(value) for name, value in headers)
    return (rename.get(out.topic, out.topic), _hash(out.key), _hash(out.value),
            _hash(joined))


def _hash(data: bytes | None) -> bytes:
    if data is None:
        return b"\x00" * 16
    return b"\x01" + hashlib.blake2b(data, digest_size=15).digest()


def _fields(a: _Entry, b: _Entry) -> tuple[str, ...]:
    return tuple(name for name, x, y in zip(FIELDS, a[1:], b[1:], strict=True) if x != y)


# -- reading outputs back ----------------------------------------------------------------


def from_topics(bootstrap: str, topics: Iterable[str], timeout_s: float = 120.0
                ) -> Iterator[Output]:
    """Every record of ``topics``, read_committed to the end (service.kafka.reading.read_topics)."""
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
