"""The first runner (stage/runner.py), and the hot path: a consumed batch, record by
record, through the transform in the loop's own thread into the guarantee, with the
clock looked at between records (checkpoints)."""

from __future__ import annotations

import time
from collections.abc import Iterable

import structlog
from confluent_kafka import (
    Message,
)

from service.contract.processing import (
    OutputRefusedError,
    Processed,
    Result,
    TopicLimitPending,
    process,
    refused,
    written_before,
)
from service.contract.records import Output, Record, Transform
from service.errors import (
    KafkaOperationError,
    PoisonRecordError,
)
from service.kafka.messages import to_record
from service.stage import machine as sm
from service.stage.holding import Holding
from service.stage.partition import Partition
from service.stage.runner import tell_written
from service.stage.transform_watch import exhausted

log = structlog.get_logger(__name__)

# The longest stretch of records between two checkpoints (liveness beat, stop, due
# commits) when no transaction falls due sooner.
_CHECKPOINT_EVERY_S = 0.5
# A transaction due in the middle of a batch commits there once this share of the
# commit interval has passed too. A fast batch (500 records in a few ms) ends first
# and commits at its tick, as any batch; a commit in the middle holds the rest of the
# batch, and a held record costs a second pass (docs/journal/2026-11-27-clock-bounded-loop.md).
_GRACE = 0.1
_NO_LIMIT = 1 << 62
_ACTIVE = sm.Phase.ACTIVE


class InProcess(Holding):
    """A runner: the transform runs in the loop's thread, record by record."""

    # Whether every record's results come with the batch (``saved``), to be
    # replayed in runs: a runner whose transform ran elsewhere (OnWorkers).
    _replays = False

    def run(self, messages: Iterable[Message], now: float, wait_s: float) -> None:
        if messages:
            self.process(messages, now)

    def waiting(self) -> bool:
        return False

    def process(self, messages: Iterable[Message], now: float,  # noqa: PLR0915 (inlined:
                saved: dict[int, list[Output]] | None = None) -> None:  # the hot path)
        """Process a batch, in offset order per partition.

        The hot path: a *flowing* partition (ACTIVE, no pause, nothing isolated or
        refused: ``PartitionState.flowing``, kept on the partition as its state
        changes) runs each record straight through ``processing.process``, and the
        records a fetch brought it in a row are written as one run
        (``Guarantee.write_run``), its bookkeeping done once. Anything that could
        change a partition's state ends the run first (writes it). A partition that
        is not flowing goes through ``_one``, which checks the state record by
        record; so do held records replayed with what the transform already yielded
        for them (``saved``).

        The clock bounds the batch: after each record the time read for the
        transform histogram is compared with the next checkpoint (the earliest open
        transaction's due time, at most ``_CHECKPOINT_EVERY_S`` away), and a run
        that fills its transaction ends too. A checkpoint writes the run, starts the
        commits that are due (their partitions hold the rest of their records) and
        beats the heartbeat; when the replica is stopping, it ends the batch: what
        was processed is released by the stop, the rest is left to the next owner.
        Past ``yield_at`` (the poll-gap bound) it ends the batch too, and the rest is
        held by its partitions, in order, for the next iterations (``_hand_back``)."""
        partitions = self.partitions
        transform, max_bytes = self.transform, self.limits.lookup
        # What the transform yielded already: with workers, every record's, replayed in
        # runs; in-process, a held record's (an output topic was looked up), each
        # checked and written on its own by ``_one``, as the first record after any
        # pause (its transaction opens as it is written, not at the run's end).
        replayed = bool(saved) and self._replays
        if replayed:
            transform = _replaying(saved, transform)  # type: ignore[arg-type]
        default_topic, dlq_topic = self.settings.output_topic, self.settings.dlq_topic or None
        observe, clock = self._transform_seconds, time.monotonic
        produced, watch = self._produced, self.watch  # watch: TXSTAGE_TRANSFORM_TIMEOUT_MS
        owner: Partition | None = None  # the flowing partition whose run this is
        run: list[Processed] = []
        consumed = position = 0         # position: the owner's next offset, as of the run
        room = _NO_LIMIT                # records the owner's transaction may still take
        yield_at = self.yield_at  # the poll-gap bound: back to consume() by then
        finished = now  # the clock after each record
        check_at = min(self._next_checkpoint(now), yield_at)
        rest = iter(messages)
        for msg in rest:
            if finished >= check_at or len(run) >= room or self.stopping:
                consumed += self._write_run(owner, run, now)
                owner, now, room = None, clock(), _NO_LIMIT
                if self._checkpoint(now):
                    break  # stopping: the rest is left to the next owner
                if now >= yield_at:
                    self._hand_back(msg, rest, saved)
                    break
                check_at = min(self._next_checkpoint(now), yield_at)
            error = msg.error()
            if error is not None:
                consumed += self._write_run(owner, run, now)
                owner = None
                self._consume_error(error, msg)
                continue
            partition = partitions.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
            if partition is None:
                continue
            if partition is not owner:
                consumed += self._write_run(owner, run, now)
                owner = None
                if not partition.flowing or partition.held or (saved and not replayed):
                    consumed += self._one(partition, msg, now, saved)
                    finished = clock()
                    continue
                owner, position = partition, partition.position
                room = self._room(partition)
            offset: int = msg.offset()  # type: ignore[assignment]
            if offset < position:
                continue  # a stale fetch from before a seek
            record = to_record(msg)
            started = clock()
            watch.record = record
            try:
                result = process(transform, record, default_topic=default_topic,
                                 dlq_topic=dlq_topic, max_bytes=max_bytes)
            except (PoisonRecordError, TopicLimitPending) as exc:
                consumed += self._write_run(owner, run, now)
                owner = None
                self._not_processed(partition, msg, exc, now,
                                    saved.get(offset) if saved else None)
                continue
            finally:
                watch.record = None
                finished = clock()
            observe(finished - started)
            outputs, failure = result
            if failure is not None:
                self.reporter.dead_lettered(partition, record, failure)
            run.append((record, outputs))
            position = offset + 1
            for out in outputs:
                produced[out.topic] += 1
        consumed += self._write_run(owner, run, now)
        self._processed(consumed)

    def _room(self, partition: Partition) -> int:
        """How many more records the partition's transaction may take in this run."""
        txn = partition.state.txn
        return self.policy.commit_max_records - partition.batch_records - (
            txn.records if txn is not None else 0)

    def _next_checkpoint(self, now: float) -> float:
        """When the records must stop for a look at the clock: the earliest due time
        of an open transaction (one opened from now on is due an interval from now),
        and at least every ``_CHECKPOINT_EVERY_S``. O(partitions), once a checkpoint."""
        interval = self.policy.interval_s
        late = interval * (1 + _GRACE)
        due = now + min(late, _CHECKPOINT_EVERY_S)
        for partition in self.partitions.values():
            state = partition.state
            txn = state.txn
            # ACTIVE only: a committing partition's transaction is past its due time
            # and takes no record (a checkpoint at every record while it commits would
            # cost the loop 2.5 times its CPU per record:
            # docs/journal/2026-11-27-clock-bounded-loop.md).
            if txn is not None and state.phase is _ACTIVE and txn.opened_at + late < due:
                due = txn.opened_at + late
        return due

    def _checkpoint(self, now: float) -> bool:
        """Between two records: beat, and start every commit that is due (by age or
        size); True when the replica stops and the batch must end here."""
        self.health.beat()
        if self.stopping:
            return True
        # Due by age once ``_GRACE`` past its interval: a fast batch ends within it and
        # the tick commits then, as for any batch, with no record held.
        aged = now - self.policy.interval_s * _GRACE
        policy = self.policy
        for partition in list(self.partitions.values()):
            if partition.batch_records:
                tell_written(partition, policy)
            if partition.state.due(aged, policy):
                self.reporter.warn_near_timeout(partition, now, policy)
                self.dispatch(partition, sm.CommitDue(now))
        return False

    def _processed(self, consumed: int) -> None:
        """A batch is done: tell the state machine what each partition wrote; count."""
        self.metrics.consumed.inc(consumed)
        policy = self.policy
        for partition in self.partitions.values():
            if partition.batch_records:
                tell_written(partition, policy)
        produced = self._produced
        for topic, count in produced.items():
            self.metrics.produced.labels(topic=topic).inc(count)
        produced.clear()

    def _write_run(self, partition: Partition | None, run: list[Processed], now: float) -> int:
        """Write a flowing partition's run (emptied) and advance its batch; how many
        records were written (fewer when a write failed: the state machine is told)."""
        if not run or partition is None:
            return 0
        failed: KafkaOperationError | None = None
        try:
            self.committer.write_run(partition.key, run)
            written = len(run)
        except KafkaOperationError as exc:
            failed, written = exc, written_before(run, exc.where.offset)
        if written:
            _advance(partition, run[0][0], run[written - 1][0], written, now)
        run.clear()
        if failed is not None:
            self.dispatch(partition, sm.ProduceFailed(failed, now))
        return written

    def _one(self, partition: Partition, msg: Message, now: float,
             saved: dict[int, list[Output]] | None = None) -> bool:
        """Process one record of a partition that is not flowing, checking its state;
        False when the record was held or dropped. From ``saved[offset]``, when the
        transform already ran on it, instead of running the transform again."""
        offset: int = msg.offset()  # type: ignore[assignment]
        state = partition.state
        if self.positions.stale(partition, offset):
            return False
        if state.holding or partition.held:  # after the records held before it
            self._hold(partition, msg, saved)
            return False
        if state.phase is not sm.Phase.ACTIVE or (
                state.pauses and sm.Pause.BACKOFF in state.pauses):
            return False  # fetched before a seek or a pause: it is read again later
        if partition.seek.check_first and not self.positions.check_first(partition, offset):
            return False
        if state.isolation is not None:
            room = state.room()
            if room is not None and room - partition.batch_records <= 0:
                self.dispatch(partition, sm.CommitDue(now))  # the transaction is full
                self._hold(partition, msg, saved)
                return False
        refusal = state.refused.get(offset)
        overrun = state.overrun  # calls on it overran: dead-lettered once they were too many
        timed_out = exhausted(overrun, offset, self.policy.max_record_attempts) if overrun \
            else None
        record = to_record(msg)
        started = time.perf_counter()
        settings = self.settings
        transform = self.transform
        yielded = saved.pop(offset, None) if saved else None
        if yielded is not None:
            transform = lambda _record: yielded  # noqa: E731 (as yielded on the first run)
        try:
            if refusal is not None or timed_out is not None:
                result = refused(record, timed_out or OutputRefusedError(refusal),
                                 settings.dlq_topic or None, self.limits.lookup)
            else:
                self.watch.record = record
                result = process(transform, record, default_topic=settings.output_topic,
                                 dlq_topic=settings.dlq_topic or None,
                                 max_bytes=self.limits.lookup)
        except (PoisonRecordError, TopicLimitPending) as exc:
            self._not_processed(partition, msg, exc, now, yielded)
            return False
        finally:
            self.watch.record = None
        self._transform_seconds(time.perf_counter() - started)
        return self._written(partition, record, result, now)

    def _written(self, partition: Partition, record: Record, result: Result,
                 now: float) -> bool:
        """Hand a processed record's outputs to the committer, named, and advance the
        partition's batch; False when the write failed (the state machine is told)."""
        if result.error is not None:
            self.reporter.dead_lettered(partition, record, result.error)
        offset = record.offset
        try:
            self.committer.write(partition.key, offset, result.outputs)
        except KafkaOperationError as exc:
            self.dispatch(partition, sm.ProduceFailed(exc, now))
            return False
        _advance(partition, record, record, 1, now)
        produced = self._produced
        for out in result.outputs:
            produced[out.topic] += 1
        return True

    def _not_processed(self, partition: Partition, msg: Message,
                       exc: PoisonRecordError | TopicLimitPending, now: float,
                       yielded: list[Output] | None = None) -> None:
        """``yielded``: what the transform yielded for the record before (in a worker):
        kept for when it is processed again, should the transform's own outputs not
        say (a dead letter's topic being looked up)."""
        if isinstance(exc, PoisonRecordError):
            self.dispatch(partition, sm.Poisoned(exc, now))
        else:  # an output topic not looked up yet: hold the record meanwhile
            outputs = exc.outputs if exc.outputs is not None else yielded
            if outputs is not None:
                partition.saved[msg.offset()] = outputs  # type: ignore[index]
            if exc.lookup is not None:  # not a topic: the schema registry (formats)
                self.topics.ask(exc.topic, exc.lookup)
            self.dispatch(partition, sm.TopicUnknown(exc.topic))
            self._hold(partition, msg)


def _replaying(saved: dict[int, list[Output]], transform: Transform) -> Transform:
    """The transform, but for a record it already ran on: what it yielded then."""
    def replay(record: Record) -> Iterable[Output]:
        yielded = saved.get(record.offset)
        return transform(record) if yielded is None else yielded
    return replay


def _advance(partition: Partition, first: Record, last: Record, records: int,
             now: float) -> None:
    """``records`` more written for ``partition``, ``first`` to ``last``: its batch
    (told to the state machine at the batch's end) and its position move on."""
    if not partition.batch_records:
        partition.batch_first, partition.batch_since = first.offset, now
        partition.batch_first_ts = first.timestamp
    partition.batch_last_ts = last.timestamp
    partition.batch_next = partition.position = last.offset + 1
    partition.batch_records += records
