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

Parked letters (``txstage.redrive.parked``) are letters like any other: a parked letter
is compared as if in its DLQ (``<dlq>.parked`` as ``<dlq>``, unless renamed itself), since
where redrive keeps a letter is history too. Reading ``kafka://`` topics also reads each
one's parking topics that exist (letters.parking_topics), and the report counts the
standing parked letters by the topic holding them.

Content is kept as 16-byte digests, so a few million outputs fit in memory.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from service.backfill.parity_report import FIELDS, Key, ParityReport, Reconciled
from service.backfill.plan import Slice
from service.backfill.specs import ParquetSink, parse_sink
from service.contract import letters, lineage
from service.contract.letters import PARKED, PARKING_SUFFIX
from service.contract.lineage import Lineage
from service.errors import ConfigError
from service.kafka.reading import partitions, read_topics

# The report's types are parity's too (callers name them parity.ParityReport).
__all__ = ["Output", "ParityReport", "Reconciled", "compare", "from_parquet", "from_topics",
           "read", "with_parking", "within_slices"]


@dataclass(frozen=True, slots=True)
class Output:
    """One output as read back from a topic or a Parquet file."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


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
    report.parked_expected, report.parked_actual = want_side.parked_in(want), \
        got_side.parked_in(got)
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
        self.parked: dict[Key, tuple[int, str]] = {}  # parked letters: generation, topic
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
        parked = generation not in (_OUTPUT, _REDRIVEN) and any(
            name == PARKED for name, _ in marks)
        if parked and generation >= self.parked.get(key, (0, ""))[0]:
            self.parked[key] = (generation, out.topic)
        entry = (generation, *_digest(out, content, self.rename, parked=parked))
        if key in self.first:
            self.more.setdefault(key, []).append(entry)
        else:
            self.first[key] = entry

    def parked_in(self, standing: Mapping[Key, _Entry]) -> dict[str, int]:
        """Standing letters that are parked, counted by the topic holding them."""
        found: Counter[str] = Counter()
        for key, (generation, topic) in self.parked.items():
            entry = standing.get(key)
            if entry is not None and entry[0] == generation:
                found[topic] += 1
        return dict(found)

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
            rename: Mapping[str, str], *, parked: bool = False
            ) -> tuple[str, bytes, bytes, bytes]:
    joined = b"".join(_hash(name.encode()) + _hash(value) for name, value in headers)
    topic = out.topic
    if parked and topic not in rename:  # compared as in its DLQ
        while topic.endswith(PARKING_SUFFIX):
            topic = topic.removesuffix(PARKING_SUFFIX)
    return (rename.get(topic, topic), _hash(out.key), _hash(out.value), _hash(joined))


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
        return from_topics(bootstrap, with_parking(topics, _exists(bootstrap)))
    sink = parse_sink(where)
    if not isinstance(sink, ParquetSink):
        raise ConfigError(f"{where!r}: compare kafka://<topics> or parquet:<path>")
    return from_parquet(sink.path)


def with_parking(topics: Iterable[str], exists: Callable[[str], bool]) -> list[str]:
    """``topics`` and the parking topics of each that exist (``<dlq>.parked``, and the
    nested ones older redrives left), so that every parked letter is read."""
    found = list(dict.fromkeys(topics))
    for topic in list(found):
        found += [t for t in letters.parking_topics(topic, exists) if t not in found]
    return found


def _exists(bootstrap: str) -> Callable[[str], bool]:
    def exists(topic: str) -> bool:
        try:
            partitions({"bootstrap.servers": bootstrap}, [topic])
        except LookupError:
            return False
        return True

    return exists


def within_slices(slices: Iterable[Slice]) -> Callable[[Lineage], bool]:
    """Accept outputs of inputs inside ``slices`` (a job's plan)."""
    by_partition: dict[tuple[str, int], list[Slice]] = {}
    for piece in slices:
        by_partition.setdefault((piece.topic, piece.partition), []).append(piece)

    def accept(tag: Lineage) -> bool:
        return any(s.contains(tag.offset) for s in by_partition.get((tag.topic, tag.partition),
                                                                     ()))

    return accept
