"""The test suite's exactly-once oracle, by lineage (V1-V5, docs/reliability.md). Internal: the
verifier operators run is ``txstage audit`` (docs/tools.md), which also understands
what this does not model.

After a run has settled: read the outputs ``read_committed`` and compare them
with what the transform makes of the committed input:

- V1 no two outputs share (``txstage.src``, ``txstage.idx``)
- V2 every input below the group's committed offsets has all its outputs, and
  the committed offsets reach the input's end offsets
- V3 per output partition, the source offsets of each input partition increase
- V4 nothing else is visible (no output of an aborted attempt)
- V5 no transaction is left open: reading ``read_committed`` reaches the high
  watermark of every output partition (a hanging transaction holds the last
  stable offset below it)

Used by the test suite, the chaos campaign, the demo and the benchmarks (``txstage backfill
verify``, ``service/backfill/parity.py``, reads topics as it does:
service.kafka.reading.read_topics).

It models a stage whose outputs are what the transform makes, or its dead letter when
the transform fails. It does not model dead letters written at write time instead of
outputs (refused, too large, to a topic that does not exist) nor what ``txstage
redrive`` writes (``txstage.redriven``, ``txstage.redrive.*``): those records, known by
the audit's rules (audit/run.py WRITE_TIME), are listed as ``unjudged`` and their inputs
left out of V2 and content, so it never calls them missing, duplicated or out of order;
an ``unjudged`` record makes the run not ok: judge it with ``txstage audit``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from service.contract import letters, lineage
from service.contract.deadletter import ERROR_CLASS, dropped_parts
from service.contract.processing import Produced, process
from service.contract.records import Record, Transform
from service.kafka.reading import OffsetReader, partitions, read_topics
from service.tools.audit.run import WRITE_TIME

Key = tuple[str, int]  # (txstage.src, txstage.idx)


def committed_offsets(bootstrap: str, group_id: str, topics: Iterable[str]) -> dict[Key, int]:
    """The group's committed offset per input partition (-1001 when none)."""
    config = {"bootstrap.servers": bootstrap}
    with OffsetReader(config, group_id) as reader:
        return reader.committed(partitions(config, topics), timeout_s=15)


def end_offsets(bootstrap: str, topics: Iterable[str]) -> dict[Key, int]:
    """Each partition's high watermark."""
    config = {"bootstrap.servers": bootstrap}
    with OffsetReader(config) as reader:
        return reader.end_offsets(partitions(config, topics))


@dataclass
class Report:
    expected: int = 0
    found: int = 0
    duplicates: list[Key] = field(default_factory=list)
    missing: list[Key] = field(default_factory=list)
    unexpected: list[Key] = field(default_factory=list)
    mismatched: list[Key] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    behind: dict[str, tuple[int, int]] = field(default_factory=dict)
    unjudged: list[Key] = field(default_factory=list)  # outside this oracle's model

    def problems(self) -> list[str]:
        checks: list[tuple[str, list[Any]]] = [
                  ("V1 duplicated outputs", self.duplicates), ("V2 missing outputs", self.missing),
                  ("V2 committed offsets behind the input end", list(self.behind.items())),
                  ("V3 out of order", self.out_of_order),
                  ("V4 unexpected outputs", self.unexpected),
                  ("outputs that differ from the transform's", self.mismatched),
                  ("write-time dead letters or redrive's records, not judged here (run "
                   "txstage audit)", self.unjudged)]
        return [f"{name}: {len(items)}, e.g. {items[:5]}" for name, items in checks if items]

    @property
    def ok(self) -> bool:
        return not self.problems()


def expected_outputs(inputs: Iterable[Record], transform: Transform, *, default_topic: str,
                     dlq_topic: str | None) -> dict[Key, Produced]:
    """What the stage must have written for ``inputs``, keyed by lineage."""
    expected: dict[Key, Produced] = {}
    for record in inputs:
        result = process(transform, record, default_topic=default_topic, dlq_topic=dlq_topic,
                         max_bytes=_unlimited)
        for index, out in enumerate(result.outputs):
            expected[(lineage.source_of(record.topic, record.partition, record.offset).decode(),
                      index)] = out
    return expected


def _unlimited(topic: str) -> int:
    return 1 << 62


def compare(outputs: Iterable[Record], expected: dict[Key, Produced]) -> Report:
    """V1, V2 (outputs), V3, V4 and content, from outputs read read_committed."""
    report = Report(expected=len(expected))
    seen: dict[Key, Record] = {}
    last: dict[tuple[str, int, str, int], int] = defaultdict(lambda: -1)
    unjudged: set[str] = set()  # inputs with a record outside the model
    for out in outputs:
        report.found += 1
        tag = lineage.read(out.headers)
        if tag is None:
            report.unexpected.append((f"{out.topic}/{out.partition}@{out.offset}", -1))
            continue
        key = (f"{tag.topic}/{tag.partition}/{tag.offset}", tag.idx)
        if _unmodelled(out, expected.get(key)):
            report.unjudged.append(key)
            unjudged.add(key[0])
            continue
        if key in seen:
            report.duplicates.append(key)
            continue
        seen[key] = out
        order = (out.topic, out.partition, tag.topic, tag.partition)
        if tag.offset < last[order]:
            report.out_of_order.append(f"{out.topic}/{out.partition}@{out.offset} <- {key[0]}")
        last[order] = max(last[order], tag.offset)
        want = expected.get(key)
        if want is None:
            report.unexpected.append(key)
        elif not _same(want, out):
            report.mismatched.append(key)
    report.missing = [key for key in expected if key not in seen and key[0] not in unjudged]
    report.mismatched = [key for key in report.mismatched if key[0] not in unjudged]
    return report


def _unmodelled(out: Record, want: Produced | None) -> bool:
    """Written by txstage redrive, or a dead letter written at write time instead of
    outputs: records only the audit judges. Unless the transform checked against says
    that input is dead-lettered (a test's model of the stage, e.g. one that fails where
    the stage's output was too large): then the letter is what it expects."""
    names = {name for name, _ in out.headers}
    if lineage.REDRIVEN in names or lineage.REDRIVE_ATTEMPT in names:
        return True
    if want is not None and any(name == ERROR_CLASS for name, _ in want.headers):
        return False
    letter = letters.parse(out.topic, out.partition, out.offset, out.timestamp, out.key,
                           out.value, out.headers)
    return letter is not None and letter.error_class.encode() in WRITE_TIME


def _same(want: Produced, out: Record) -> bool:
    """The output is what the transform makes; a dead letter cut to fit its topic
    (deadletter.DROPPED) is compared without the parts it left out."""
    key, value = want.key, want.value
    dropped = dropped_parts(out.headers)
    if dropped:
        key = None if "key" in dropped else key
        value = None if "value" in dropped else value
    return (want.topic, key, value) == (out.topic, out.key, out.value)


def verify(bootstrap: str, *, input_topics: list[str], output_topics: list[str],
           group_id: str, transform: Transform, default_topic: str, dlq_topic: str | None = None,
           timeout_s: float = 60.0, since: Callable[[Record], bool] | None = None) -> Report:
    """Read inputs and outputs read_committed, and check V1-V5 against ``transform``."""
    inputs = read_topics(bootstrap, input_topics, timeout_s=timeout_s)
    last: dict[tuple[str, int], int] = {}  # each partition's last committed record
    for record in inputs:
        key = (record.topic, record.partition)
        last[key] = max(last.get(key, -1), record.offset)
    if since is not None:
        inputs = [r for r in inputs if since(r)]
    expected = expected_outputs(inputs, transform, default_topic=default_topic,
                                dlq_topic=dlq_topic)
    report = compare(read_topics(bootstrap, output_topics, timeout_s=timeout_s), expected)
    # Behind: a committed record at or past the committed offset. Not "below the end
    # offset": with transactional input the end is one past a commit marker, an offset
    # no read_committed reader is given, and a group that read everything commits the
    # marker's offset.
    ends = end_offsets(bootstrap, input_topics)
    for key, committed in committed_offsets(bootstrap, group_id, input_topics).items():
        if key in last and committed <= last[key]:  # an empty partition has nothing to commit
            report.behind[f"{key[0]}/{key[1]}"] = (committed, ends[key])
    return report
