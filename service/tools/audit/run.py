"""The audit, in the order that makes it sound on a pipeline that keeps running:

1. last stable offsets and high watermarks of every input and output partition (t0);
2. the group's committed offsets C: the window of each input partition is
   ``[start, C)`` (start: earliest, or the ``--from`` bound);
3. the window's inputs, read read_committed; the transform says which outputs each
   must have (kept as a few bytes per input: ledger.py);
4. every output partition up to its last stable offset *now* (taken after C, so the
   outputs of every input below C are in it), from its start or the ``--from`` time;
5. per input: missing, mismatched, duplicated outputs; per output: no input, order;
6. after ``stuck_after_s``: partitions whose last stable offset stayed below the high
   watermark of t0 the whole time hold an open transaction that long (hanging).

Outputs of inputs at or past C (the pipeline went on) or before the window are counted,
not checked.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, cast

from confluent_kafka import IsolationLevel, Message

from service.backfill.specs import Bound, Earliest, Offsets, Timestamp
from service.contract import lineage
from service.contract.deadletter import ERROR_CLASS
from service.contract.letters import PARKED, parking_topics
from service.contract.processing import OutputRefusedError, OutputTooLargeError, process
from service.contract.records import Transform
from service.errors import ConfigError, PoisonRecordError
from service.kafka import reading
from service.kafka.cluster import UnknownTopicError
from service.kafka.messages import to_record
from service.kafka.reading import EARLIEST, LATEST, Partition
from service.tools.audit.ledger import Finding, PartitionLedger, digest
from service.tools.audit.report import AuditReport

# Dead letters the stage writes *instead of* outputs at write time (the broker refused
# one, one is larger than its topic accepts, or its topic does not exist: the last two
# come from the stage's topic limits, which the audit does not ask): the transform alone
# cannot foresee them.
WRITE_TIME = {error.__qualname__.encode()
               for error in (OutputRefusedError, OutputTooLargeError, UnknownTopicError)}


def _unlimited(topic: str) -> int:
    return 1 << 62


def audit(*, config: Mapping[str, Any], group_id: str, input_topics: list[str],
          output_topics: list[str], transform: Transform, default_topic: str,
          dlq_topic: str | None, start: Bound | None = None, stuck_after_s: float = 15.0,
          timeout_s: float = 300.0, max_examples: int = 10,
          parking_topic: str | None = None) -> AuditReport:
    """``parking_topic``: where redrive parks (its ``--parking-topic``), None for the
    DLQ's own (letters.parking_topic_of)."""
    began = time.monotonic()
    run = _Audit(config, transform, default_topic, dlq_topic, f"{group_id}.audit", timeout_s,
                 AuditReport(max_examples=max_examples))
    inputs = reading.partitions(config, input_topics)
    outputs = reading.partitions(config, dict.fromkeys(output_topics))
    watched = inputs + outputs
    lso0 = reading.list_offsets(config, watched, LATEST)
    high0 = reading.list_offsets(config, watched, LATEST, IsolationLevel.READ_UNCOMMITTED)
    committed = reading.committed(config, group_id, inputs)
    starts = _starts(config, inputs, start or Earliest())
    run.read_inputs({k: PartitionLedger(starts[k], max(committed[k], 0)) for k in inputs})
    # The topics the transform wrote for these inputs are audited too (a fan-out's second
    # topic): learned by running it, not remembered by the operator. One that does not
    # exist holds nothing to check (the stage dead-letters what it routes there).
    learned = sorted(run.topics - set(output_topics) - set(input_topics))
    run.report.learned_topics = list(learned)
    more = [key for topic in learned for key in _partitions_if_any(config, topic)]
    if dlq_topic:  # letters redrive parked stand for their inputs too
        more += _parked_partitions(config, run, dlq_topic, parking_topic)
    if more:
        outputs += more
        watched += more
        lso0 |= reading.list_offsets(config, more, LATEST)
        high0 |= reading.list_offsets(config, more, LATEST, IsolationLevel.READ_UNCOMMITTED)
    # Taken after C: every output of an input below C is below these last stable offsets.
    ends = reading.list_offsets(config, outputs, LATEST)
    firsts = reading.offsets_for_time(config, outputs, start.ms) \
        if isinstance(start, Timestamp) else reading.list_offsets(config, outputs, EARLIEST)
    run.read_outputs({k: (v, ends[k]) for k, v in firsts.items()})
    run.judge()
    _hanging(config, run.report, watched, lso0, high0, began + stuck_after_s)
    _read_to(run.report, outputs, ends, high0)
    run.report.seconds = time.monotonic() - began
    return run.report


def _partitions_if_any(config: Mapping[str, Any], topic: str) -> list[Partition]:
    try:
        return reading.partitions(config, [topic])
    except LookupError:  # does not exist: nothing was written to it
        return []


def _parked_partitions(config: Mapping[str, Any], run: _Audit, dlq_topic: str,
                       chosen: str | None) -> list[Partition]:
    """The partitions of every parking topic of the DLQ that exists and may be read:
    ``chosen`` (redrive's --parking-topic) or ``<dlq>.parked``, and any ``.parked.parked``
    left by redrives of a parking topic before parking was kept in one place. Each is
    optional: a parked letter's input is accounted for by its earlier letters in the DLQ
    too, so without READ on one the audit goes on and says so."""
    found: dict[str, list[Partition]] = {}

    def exists(topic: str) -> bool:
        try:
            found[topic] = _partitions_if_any(config, topic)
        except PermissionError:
            run.report.notes.append(f"parked letters not counted: no READ on topic `{topic}`")
            found[topic] = []
        return bool(found[topic])

    topics = parking_topics(dlq_topic, exists)
    if chosen and chosen not in (*topics, dlq_topic) and exists(chosen):
        topics.append(chosen)
    run.letter_topics.update(topics)
    return [key for topic in topics for key in found[topic]]


def _read_to(report: AuditReport, outputs: list[Partition], ends: dict[Partition, int],
             high0: dict[Partition, int]) -> None:
    """How far each output partition was read, and why there: its last stable offset,
    below the high watermark while a transaction is open (outputs past it unchecked)."""
    for key in outputs:
        held = high0[key] - ends[key]
        why = "the end" if held <= 0 else \
            f"the last stable offset: a transaction is open ({held} offsets past it unchecked)"
        report.read_to[f"{key[0]}/{key[1]}"] = f"read to {ends[key]:,} ({why})"


class _Audit:
    """The two reading passes and what they leave behind."""

    def __init__(self, config: Mapping[str, Any], transform: Transform, default_topic: str,
                 dlq_topic: str | None, reader: str, timeout_s: float,
                 report: AuditReport) -> None:
        self.config, self.transform, self.reader, self.timeout_s = (config, transform, reader,
                                                                     timeout_s)
        self.default_topic, self.dlq_topic, self.report = default_topic, dlq_topic, report
        # The DLQ, and the parking topics found (_parked_partitions).
        self.letter_topics: set[str] = {dlq_topic} if dlq_topic else set()
        self.ledgers: dict[Partition, PartitionLedger] = {}
        self.last: dict[tuple[str, int, str, int], int] = {}
        self.topics: set[str] = set()  # every topic the transform wrote to

    def read_inputs(self, ledgers: dict[Partition, PartitionLedger]) -> None:
        self.ledgers = ledgers
        self.report.windows = {f"{t}/{p}": (v.start, v.end) for (t, p), v in ledgers.items()}
        self.report.inputs = reading.read(self.config, self.reader,
                                          {k: (v.start, v.end) for k, v in ledgers.items()},
                                          self._input, timeout_s=self.timeout_s)

    def _input(self, msg: Message) -> None:
        record = to_record(msg)
        ledger = self.ledgers[(record.topic, record.partition)]
        try:
            result = process(self.transform, record, default_topic=self.default_topic,
                             dlq_topic=self.dlq_topic, max_bytes=_unlimited)
        except PoisonRecordError:  # no DLQ: the stage stops there, it commits nothing past it
            ledger.expect(record.offset, [])
            return
        self.report.expected_outputs += len(result.outputs)
        self.topics.update(out.topic for out in result.outputs)
        if result.dead_lettered:
            ledger.expect_letter(record.offset)
            return
        ledger.expect(record.offset, [digest(i, o.topic, o.key, o.value)
                                      for i, o in enumerate(result.outputs)])

    def read_outputs(self, windows: dict[Partition, tuple[int, int]]) -> None:
        self.report.outputs_read = reading.read(self.config, self.reader, windows, self._output,
                                                timeout_s=self.timeout_s)

    def _output(self, msg: Message) -> None:
        report = self.report
        where = f"{msg.topic()}/{msg.partition()}@{msg.offset()}"
        headers = cast(list[tuple[str, bytes | None]], msg.headers() or [])
        tag = lineage.read(headers)
        if tag is None:
            report.add("unexpected", f"{where}: no lineage headers")
            return
        marks = dict(headers)
        redrive = marks.get(lineage.REDRIVEN)
        attempt = marks.get(lineage.REDRIVE_ATTEMPT)
        if redrive is None and attempt is None:  # redrive writes old inputs late: no order
            order = (str(msg.topic()), int(msg.partition() or 0), tag.topic, tag.partition)
            if tag.offset < self.last.get(order, -1):
                report.add("out_of_order", f"{where} <- {tag.topic}/{tag.partition}/"
                                           f"{tag.offset} after {self.last[order]}")
            self.last[order] = max(self.last.get(order, -1), tag.offset)
        ledger = self.ledgers.get((tag.topic, tag.partition))
        if ledger is None:
            report.add("unexpected", f"{where}: from {tag.topic}/{tag.partition}, not an input")
            return
        if tag.offset not in ledger:
            report.outputs_ahead += 1
            return
        error_class = marks.get(ERROR_CLASS) if msg.topic() in self.letter_topics else None
        if error_class is not None:
            # Parked wherever it is read: redrive appends the mark last (letters.parse).
            parked = str(msg.topic()) if headers[-1][0] == PARKED else None
            found = ledger.letter(tag.offset, int(attempt or 0),
                                  replaces_outputs=error_class in WRITE_TIME, parked_in=parked)
        else:
            found = ledger.see(tag.offset, tag.idx,
                               digest(tag.idx, str(msg.topic()), msg.key(), msg.value()),
                               redriven=redrive is not None)
        if found is not None:
            report.add(found.value, f"{tag.topic}/{tag.partition}/{tag.offset} "
                                    f"output {tag.idx} at {where}")

    def judge(self) -> None:
        for ledger in self.ledgers.values():
            for _, where in ledger.parked():
                self.report.letters_parked += 1
                self.report.parked_in[where] = self.report.parked_in.get(where, 0) + 1
        for (topic, partition), ledger in self.ledgers.items():
            for finding, offset in ledger.findings():
                if finding is Finding.PENDING:
                    self.report.letters_pending += 1
                elif finding is Finding.DUPLICATE:
                    self.report.add("duplicate", f"{topic}/{partition}/{offset}: outputs "
                                                 f"beside a dead letter")
                else:
                    self.report.add(finding.value, f"{topic}/{partition}/{offset}")


def _starts(config: Mapping[str, Any], inputs: list[Partition], bound: Bound
            ) -> dict[Partition, int]:
    if isinstance(bound, Timestamp):
        return reading.offsets_for_time(config, inputs, bound.ms)
    earliest = reading.list_offsets(config, inputs, EARLIEST)
    if isinstance(bound, Earliest):
        return earliest
    if isinstance(bound, Offsets):
        if len({t for t, _ in inputs}) != 1:
            raise ConfigError("--from offsets:... needs a single input topic")
        return {(t, p): max(earliest[(t, p)], bound.by_partition.get(p, earliest[(t, p)]))
                for t, p in inputs}
    raise ConfigError(f"--from {bound}: expected earliest, offsets:... or timestamp:...")


def _hanging(config: Mapping[str, Any], report: AuditReport, watched: list[Partition],
             lso0: dict[Partition, int], high0: dict[Partition, int], until: float) -> None:
    """A partition whose last stable offset stayed at its t0 value, below its t0 high
    watermark, until ``until``: a transaction has been open at least that long."""
    suspects = [k for k in watched if lso0[k] < high0[k]]
    while suspects:
        lso1 = reading.list_offsets(config, suspects, LATEST)
        suspects = [k for k in suspects if lso1[k] == lso0[k]]  # moved: not hanging
        if not suspects or time.monotonic() >= until:
            break
        time.sleep(min(_RECHECK_S, max(until - time.monotonic(), 0.0)))
    for key in suspects:
        report.add("hanging", f"{key[0]}/{key[1]}: last stable offset {lso0[key]} below "
                              f"the high watermark {high0[key]} the whole audit")


_RECHECK_S = 0.5  # a suspected hanging transaction is looked at again this often
