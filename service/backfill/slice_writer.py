"""The exactly-once unit of the Kafka sink: one slice, one transactional producer.

A slice attempt: ``init_transactions()`` under ``<prefix>.backfill.<job_id>.<slice>``
(fencing an earlier attempt); read the slice's committed progress (read_committed);
read the inputs from there and ``process()`` each (the stream's own function), its
outputs produced inside the open transaction; at each bound (records, bytes kept for
a replay, or time) produce the new progress record and commit, outputs and progress
together; at the end, a last commit marks the slice done. "Done" is checked, not
assumed: a file range must deliver its counted rows, a Kafka range that stops short
asks Kafka (``Unread``) whether a record is left, else IncompleteSliceError.

Errors follow the stream's rules (docs/backfill.md, "How exactly-once works"):
retriable → retry; abortable → abort and commit the same inputs again from memory (a
refused output's record dead-lettered, found as the stream finds it); fenced → fail.
A poison record with no dead-letter topic commits what came before it and fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from service.backfill.plan import Slice
from service.backfill.progress import PARTITION as PROGRESS_PARTITION
from service.backfill.progress import SliceProgress, encode_progress, slice_key
from service.contract.processing import OutputRefusedError, Produced, Result, refused
from service.contract.records import Record
from service.error_codes import REFUSALS
from service.errors import AbortableError, Failure, KafkaOperationError, PoisonRecordError
from service.kafka.producer import PinnedProducer

log = logging.getLogger(__name__)

Process = Callable[[Record], Result]
MAX_REPLAYS = 3
# A transaction's results are kept in memory to replay it after an abort: it commits at
# whichever bound it reaches first (bench.backfill: docs/backfill.md, "Performance").
DEFAULT_TRANSACTION_RECORDS = 20_000
DEFAULT_TRANSACTION_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SliceTask:
    """What a slice attempt needs besides its clients (picklable, sent to executors)."""

    piece: Slice
    job_id: str
    transactional_id: str
    progress_topic: str
    transaction_records: int = DEFAULT_TRANSACTION_RECORDS
    transaction_ms: int = 2000
    transaction_bytes: int = DEFAULT_TRANSACTION_BYTES


class InputOrderError(RuntimeError):
    """Input offsets of a slice must increase strictly and stay inside the slice."""


class IncompleteSliceError(RuntimeError):
    """The input of a slice ended before its whole range was read."""


# From an offset, the first record (read_committed) below the slice's end, or None.
Unread = Callable[[int], int | None]
# From an offset (the committed progress), the slice's inputs in offset order.
Read = Callable[[int], Iterable[Record]]


@dataclass(slots=True)
class SliceOutcome:
    progress: SliceProgress
    skipped: int = 0  # inputs below the committed progress, already written by an earlier run
    records: int = 0  # inputs this attempt processed and committed
    outputs: int = 0
    dead_lettered: int = 0
    transactions: int = 0
    aborts: int = 0


@dataclass(slots=True)
class _Pending:
    """The open transaction: its inputs' results, kept to replay after an abort."""

    results: list[tuple[Record, Result]] = field(default_factory=list)
    outputs: int = 0
    dead_lettered: int = 0
    last_offset: int = -1
    started: float = 0.0
    open: bool = False
    kept_bytes: int = 0  # keys and values of the inputs and outputs in ``results``


class SliceWriter:
    def __init__(self, task: SliceTask, producer: PinnedProducer,
                 read_progress: Callable[[], SliceProgress | None], process: Process,
                 clock: Callable[[], float] = time.monotonic, *,
                 dlq_topic: str | None = None, unread: Unread | None = None,
                 max_bytes: Callable[[str], int] | None = None) -> None:
        self.task, self.producer, self.process, self.clock = task, producer, process, clock
        self.dlq_topic = dlq_topic
        self._max_bytes = max_bytes  # process's: a refused record's letter fits its topic
        self._read_progress = read_progress
        self._unread = unread
        self._seen = 0       # inputs handed over, skipped ones included
        self._read_to = -1   # the last input offset handed over + 1
        self._pending = _Pending()
        self._failed: tuple[Failure, ...] = ()  # what the last failed commit's reports said
        self.outcome = SliceOutcome(SliceProgress.initial(task.piece))

    def run(self, read: Read) -> SliceOutcome:
        """Write the slice's outputs exactly once, reading its inputs from the committed
        progress (a source that cannot seek may hand over earlier ones: they are
        skipped); returns what this attempt did."""
        self.producer.init()
        self.outcome.progress = self._committed_progress()
        if self.outcome.progress.done:
            log.info("slice %d: already done", self.task.piece.index)
            return self.outcome
        self._log_start()
        # On a failure, no abort here: after a fenced or timed-out commit librdkafka
        # refuses one (and an abort must never follow a commit time-out). Closing the
        # producer aborts what it still can; the next attempt's init_transactions the rest.
        resumed_at = self.outcome.progress.next_offset
        self._write(read(resumed_at))
        missing = self._missing(resumed_at)
        if missing is not None:
            self._commit(done=False)  # what was read is written: keep it
            raise IncompleteSliceError(
                f"slice {self.task.piece.index} of job {self.task.job_id} "
                f"({self.task.piece.topic}/{self.task.piece.partition} offsets "
                f"{self.task.piece.start}..{self.task.piece.end - 1}) is not done: {missing}")
        self._commit(done=True)
        return self.outcome

    def _missing(self, resumed_at: int) -> str | None:
        """Why the whole range was not read, or None when it was."""
        piece = self.task.piece
        if piece.records is not None:  # a file range: the plan counted its rows
            if self._seen != piece.records and resumed_at < piece.end:
                return f"{self._seen} of its {piece.records} rows arrived"
            return None
        read_to = max(self._read_to, resumed_at)
        if read_to >= piece.end or self._unread is None:
            return None
        found = self._unread(read_to)
        if found is None:  # only markers or aborted records were left
            return None
        return (f"the input stopped at offset {read_to - 1}, but Kafka has a record at "
                f"offset {found}")

    # -- steps -------------------------------------------------------------------------

    def _committed_progress(self) -> SliceProgress:
        piece, found = self.task.piece, self._read_progress()
        if found is None:
            return SliceProgress.initial(piece)
        if (found.start, found.end) != (piece.start, piece.end):
            raise InputOrderError(
                f"slice {piece.index} of job {self.task.job_id} was planned as offsets "
                f"{found.start}..{found.end}, now {piece.start}..{piece.end}: the plan changed"
            )
        return found

    def _write(self, records: Iterable[Record]) -> None:
        last = -1
        for record in records:
            self._check_order(record, last)
            last = record.offset
            self._seen += 1
            self._read_to = last + 1
            if record.offset < self.outcome.progress.next_offset:
                self.outcome.skipped += 1
                continue
            self._add(record)
            if self._due():
                self._commit(done=False)

    def _add(self, record: Record) -> None:
        try:
            result = self.process(record)
        except PoisonRecordError:
            if self._pending.open:
                self._commit(done=False)  # the records before it are fine: keep them
            raise
        self._maybe_begin()
        pending = self._pending
        pending.results.append((record, result))
        pending.outputs += len(result.outputs)
        pending.dead_lettered += int(result.dead_lettered)
        kept = len(record.value or b"") + len(record.key or b"")
        for out in result.outputs:
            kept += len(out.value or b"") + len(out.key or b"")
        pending.kept_bytes += kept
        pending.last_offset = record.offset
        try:
            self._produce_all(result.outputs, record.offset)
        except AbortableError as exc:
            self._recover(exc)  # commits every pending result, this one included

    def _due(self) -> bool:
        pending = self._pending
        return (len(pending.results) >= self.task.transaction_records
                or pending.kept_bytes >= self.task.transaction_bytes
                or (self.clock() - pending.started) * 1000 >= self.task.transaction_ms)

    def _commit(self, *, done: bool, attempt: int = 0) -> None:
        """Produce the progress record and commit it with the outputs; on an abort,
        commit the same inputs again (see _recover)."""
        if not self._pending.open and (self.outcome.progress.done or not done):
            return
        self._maybe_begin()
        progress = self._next_progress(done)
        try:
            self._produce_progress(progress)
            self._commit_transaction()
        except AbortableError as exc:
            if attempt >= MAX_REPLAYS:
                raise
            self._recover(exc)  # the inputs are committed now, not yet "done"
            if done:  # an empty transaction that marks the slice done
                self._commit(done=True, attempt=attempt + 1)
            return
        self._account(progress)

    def _next_progress(self, done: bool) -> SliceProgress:
        pending, piece = self._pending, self.task.piece
        next_offset = piece.end if done else pending.last_offset + 1
        return self.outcome.progress.advanced(next_offset, len(pending.results),
                                              pending.outputs, pending.dead_lettered, done)

    def _recover(self, cause: AbortableError) -> None:
        """Abort the open transaction, then commit its inputs again from their results
        (the transform is not called twice), finding any record whose outputs the
        broker refuses and dead-lettering it, as the stream does."""
        failures = self._failures_of(cause)
        results = self._pending.results
        self._abort(cause, len(results))
        self._write_group(results, failures, cause)

    def _write_group(self, results: list[tuple[Record, Result]], failures: tuple[Failure, ...],
                     cause: AbortableError | None) -> None:
        """Commit ``results`` in one transaction, replaying it after an abort.

        Refusals (service.kafka.delivery.REFUSALS: the broker will never take that output)
        are isolated like the stream's: a refusal that names one record of the group
        (or a group of one) makes that record's dead letter replace its outputs; one
        that cannot tell (the broker refused a whole batch) splits the group in two
        halves, each committed on its own. Anything else is replayed, at most
        MAX_REPLAYS times in a row."""
        replays = 0 if cause is None else 1
        while results:
            refusals = [f for f in failures if f.refusal]
            if refusals:
                culprit = _culprit(refusals, results)
                if culprit is None:
                    half = len(results) // 2
                    log.warning("slice %d: the broker refused outputs of offsets %d..%d and the "
                                "reports cannot tell whose: committing them in halves",
                                self.task.piece.index, results[0][0].offset,
                                results[-1][0].offset)
                    self._write_group(results[:half], (), None)
                    self._write_group(results[half:], (), None)
                    return
                results = self._dead_lettered(results, culprit, refusals[0])
                failures, replays = (), 0
            elif cause is not None and replays > MAX_REPLAYS:
                raise cause
            self._pending = _pending_of(results, self.clock())
            try:
                self._maybe_begin()
                for record, result in results:
                    self._produce_all(result.outputs, record.offset)
                progress = self._next_progress(False)
                self._produce_progress(progress)
                self._commit_transaction()
            except AbortableError as exc:
                failures, cause = self._failures_of(exc), exc
                self._abort(exc, len(results))
                replays += 1
                continue
            self._account(progress)
            return

    def _dead_lettered(self, results: list[tuple[Record, Result]], offset: int,
                       refusal: Failure) -> list[tuple[Record, Result]]:
        """``results`` with the record at ``offset`` dead-lettered (the stream's
        service.contract.processing.refused). Without a dead-letter topic the records before it
        are committed first, then PoisonRecordError names it."""
        index = next(i for i, (record, _) in enumerate(results) if record.offset == offset)
        record, result = results[index]
        cause = f"{refusal.name}: {refusal.message}"
        log.warning("slice %d: the broker refused the outputs of offset %d, dead-lettering "
                    "it: %s", self.task.piece.index, offset, cause)
        # A dead letter refused in turn leaves nowhere to write the record: poison.
        dlq = None if isinstance(result.error, OutputRefusedError) else self.dlq_topic
        try:
            letter = refused(record, OutputRefusedError(cause), dlq, self._max_bytes)
        except PoisonRecordError:
            self._write_group(results[:index], (), None)
            raise
        return [*results[:index], (record, letter), *results[index + 1:]]

    def _abort(self, cause: AbortableError, inputs: int) -> None:
        log.warning("slice %d: transaction aborted (%d inputs): %s",
                    self.task.piece.index, inputs, cause)
        self.producer.abort()
        self.outcome.aborts += 1
        self._pending = _Pending()

    def _failures_of(self, error: AbortableError) -> tuple[Failure, ...]:
        """What the delivery reports said about the failed transaction (the commit's
        own error too, when it is itself a refusal)."""
        failures = self._failed + self.producer.take_failures()
        self._failed = ()
        if error.code in REFUSALS:
            failures += (Failure(error.code, error.error.name(), error.error.str(), None),)
        return failures

    def _account(self, progress: SliceProgress) -> None:
        pending, outcome = self._pending, self.outcome
        outcome.records += len(pending.results)
        outcome.outputs += pending.outputs
        outcome.dead_lettered += pending.dead_lettered
        outcome.transactions += 1
        outcome.progress = progress
        self._pending = _Pending()

    # -- producer calls ----------------------------------------------------------------

    def _maybe_begin(self) -> None:
        if self._pending.open:
            return
        self.producer.begin()
        self._pending.open = True
        self._pending.started = self.clock()

    def _produce_all(self, outputs: list[Produced], offset: int) -> None:
        for out in outputs:
            self.producer.produce(out, offset)

    def _commit_transaction(self) -> None:
        """commit_transaction (the producer retries it while retriable); a failure names
        the first output whose delivery failed, as the stream's commit does, and the
        reports are kept for _failures_of."""
        try:
            self.producer.commit()
        except KafkaOperationError as exc:
            self._failed = self.producer.take_failures()
            if self._failed:
                exc.add_note(f"first failed output: {self._failed[0].name}: "
                             f"{self._failed[0].message}")
            raise

    def _produce_progress(self, progress: SliceProgress) -> None:
        key = slice_key(self.task.job_id, self.task.piece.index)
        record = Produced(self.task.progress_topic, key, encode_progress(progress), [])
        self.producer.produce(record, max(self._pending.last_offset, progress.start),
                              partition=PROGRESS_PARTITION)  # read back from there only

    def _check_order(self, record: Record, last: int) -> None:
        piece = self.task.piece
        if record.offset <= last or not piece.contains(record.offset) \
                or (record.topic, record.partition) != (piece.topic, piece.partition):
            raise InputOrderError(
                f"slice {piece.index} ({piece.topic}/{piece.partition} offsets "
                f"{piece.start}..{piece.end}) got {record.topic}/{record.partition}@"
                f"{record.offset} after offset {last}: inputs must be unique and in order"
            )

    def _log_start(self) -> None:
        progress, piece = self.outcome.progress, self.task.piece
        if progress.next_offset > piece.start:
            log.info("slice %d: resuming at offset %d (%d inputs already committed)",
                     piece.index, progress.next_offset, progress.records_in)


def _pending_of(results: list[tuple[Record, Result]], now: float) -> _Pending:
    """A transaction (not begun yet) holding ``results``."""
    return _Pending(list(results), sum(len(r.outputs) for _, r in results),
                    sum(1 for _, r in results if r.dead_lettered),
                    results[-1][0].offset if results else -1, now)


def _culprit(refusals: list[Failure], results: list[tuple[Record, Result]]) -> int | None:
    """The one input offset the refusals name inside ``results`` (the stream's rule:
    service.stage.machine.faults._culprits), or the only record of a group of one."""
    offsets = {record.offset for record, _ in results}
    named = {f.offset for f in refusals if f.offset is not None and f.offset in offsets}
    if len(named) == 1:
        return named.pop()
    if len(results) == 1:
        return results[0][0].offset
    return None
