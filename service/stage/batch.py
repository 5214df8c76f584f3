"""The hot path: a consumed batch, record by record, through the transform into
the guarantee, with the clock looked at between records (checkpoints)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from itertools import chain

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
from service.contract.records import Output, Record
from service.errors import (
    KafkaOperationError,
    PoisonRecordError,
)
from service.kafka.messages import to_record
from service.stage import machine as sm
from service.stage.loop_state import LoopState
from service.stage.partition import Partition

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


class Batch(LoopState):
    """The hot path of :class:`Loop`: a consumed batch through the transform."""

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
        default_topic, dlq_topic = self.settings.output_topic, self.settings.dlq_topic or None
        observe, clock = self._transform_seconds, time.monotonic
        produced = self._produced
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
                if not partition.flowing or saved or partition.held:
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
            try:
                result = process(transform, record, default_topic=default_topic,
                                 dlq_topic=dlq_topic, max_bytes=max_bytes)
            except (PoisonRecordError, TopicLimitPending) as exc:
                consumed += self._write_run(owner, run, now)
                owner = None
                self._not_processed(partition, msg, exc, now)
                continue
            finally:
                finished = clock()
            observe(finished - started)
            outputs, failure = result
            if failure is not None:
                self._dead_lettered(partition, record, failure)
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
        interval = self.policy.commit_interval_s
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
        aged = now - self.policy.commit_interval_s * _GRACE
        for partition in list(self.partitions.values()):
            if partition.batch_records:
                self._tell_written(partition)
            if partition.state.due(aged, self.policy):
                self._warn_near_timeout(partition, now)
                self.dispatch(partition, sm.CommitDue(now))
        return False

    def _processed(self, consumed: int) -> None:
        """A batch is done: tell the state machine what each partition wrote; count."""
        self.metrics.consumed.inc(consumed)
        for partition in self.partitions.values():
            if partition.batch_records:
                self._tell_written(partition)
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
        if self._stale(partition, offset):
            return False
        if state.holding or partition.held:  # after the records held before it
            self._hold(partition, msg, saved)
            return False
        if state.phase is not sm.Phase.ACTIVE or (
                state.pauses and sm.Pause.BACKOFF in state.pauses):
            return False  # fetched before a seek or a pause: it is read again later
        if partition.check_first and not self._check_first(partition, offset):
            return False
        if state.isolation is not None:
            room = state.room()
            if room is not None and room - partition.batch_records <= 0:
                self.dispatch(partition, sm.CommitDue(now))  # the transaction is full
                self._hold(partition, msg, saved)
                return False
        refusal = state.refused.get(offset)
        record = to_record(msg)
        started = time.perf_counter()
        settings = self.settings
        transform = self.transform
        yielded = saved.pop(offset, None) if saved else None
        if yielded is not None:
            transform = lambda _record: yielded  # noqa: E731 (as yielded on the first run)
        try:
            if refusal is not None:
                result = refused(record, OutputRefusedError(refusal), settings.dlq_topic or None,
                                 self.limits.lookup)
            else:
                result = process(transform, record, default_topic=settings.output_topic,
                                 dlq_topic=settings.dlq_topic or None,
                                 max_bytes=self.limits.lookup)
        except (PoisonRecordError, TopicLimitPending) as exc:
            self._not_processed(partition, msg, exc, now)
            return False
        self._transform_seconds(time.perf_counter() - started)
        return self._written(partition, record, result, now)

    def _written(self, partition: Partition, record: Record, result: Result,
                 now: float) -> bool:
        """Hand a processed record's outputs to the committer, named, and advance the
        partition's batch; False when the write failed (the state machine is told)."""
        if result.error is not None:
            self._dead_lettered(partition, record, result.error)
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
                       exc: PoisonRecordError | TopicLimitPending, now: float) -> None:
        if isinstance(exc, PoisonRecordError):
            self.dispatch(partition, sm.Poisoned(exc, now))
        else:  # an output topic not looked up yet: hold the record meanwhile
            if exc.outputs is not None:
                partition.saved[msg.offset()] = exc.outputs  # type: ignore[index]
            if exc.lookup is not None:  # not a topic: the schema registry (formats)
                self._lookups[exc.topic] = exc.lookup
            self.dispatch(partition, sm.TopicUnknown(exc.topic))
            self._hold(partition, msg)

    def _stale(self, partition: Partition, offset: int) -> bool:
        """A record fetched before the partition's last seek: it is read again."""
        return offset < partition.position or partition.seek_to is not None \
            or partition.seek_batch == self._batch

    def _hand_back(self, first: Message, rest: Iterator[Message],
                   saved: dict[int, list[Output]] | None) -> None:
        """The poll-gap bound ends the batch at ``first``: it and the rest are held by
        their partitions, in order (a record the partition would not process now, as
        ``_one`` decides, is dropped: it is read again after its seek), and are
        processed first once the loop has been back to consume()."""
        partitions = self.partitions
        for msg in chain((first,), rest):
            if msg.error() is not None:
                self._consume_error(msg.error(), msg)  # type: ignore[arg-type]
                continue
            partition = partitions.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
            if partition is None or self._stale(partition, msg.offset()):  # type: ignore[arg-type]
                continue
            state = partition.state
            if state.holding or partition.held or (state.phase is sm.Phase.ACTIVE and not (
                    state.pauses and sm.Pause.BACKOFF in state.pauses)):
                self._hold(partition, msg, saved)
        self.metrics.poll_gap_yields.inc()

    def _hold(self, partition: Partition, msg: Message,
              saved: dict[int, list[Output]] | None = None) -> None:
        """Hold a record, in order, with what the transform already yielded for it
        (``saved``, when a held record is held again: it is not transformed twice).
        At the first limit reached (records or bytes held by the partition, or bytes
        held by the replica) the partition stops fetching until they are processed."""
        if saved:
            yielded = saved.pop(msg.offset(), None)  # type: ignore[arg-type]
            if yielded is not None:
                partition.saved[msg.offset()] = yielded  # type: ignore[index]
        held = partition.held
        if not held:
            partition.held_since = time.monotonic()
        held.append(msg)
        size = held_size(msg)
        partition.held_bytes += size
        self.held_bytes += size
        policy = self.policy
        if (len(held) >= policy.backlog_limit
                or partition.held_bytes >= policy.held_partition_max_bytes
                or self.held_bytes >= policy.held_max_bytes) \
                and sm.Pause.BACKLOG not in partition.state.pauses:
            self.dispatch(partition, sm.BacklogFull())

    def _take_held(self, partition: Partition) -> tuple[list[Message], dict[int, list[Output]]]:
        """The partition's held records and saved outputs, no longer counted as held."""
        held, partition.held = partition.held, []
        saved, partition.saved = partition.saved, {}
        self.held_bytes -= partition.held_bytes
        partition.held_bytes = 0
        return held, saved

    def _drain(self, partition: Partition) -> None:
        """Process what the partition holds (before anything fetched later), as far as
        the poll-gap bound allows; the rest stays held, in order. Once below the
        limits, an active partition fetches again."""
        if partition.releasing or not partition.held:
            return
        if time.monotonic() < self.yield_at:
            held, saved = self._take_held(partition)
            self.process(held, time.monotonic(), saved)
        state = partition.state
        policy = self.policy
        if state.pauses and sm.Pause.BACKLOG in state.pauses and state.phase is sm.Phase.ACTIVE \
                and len(partition.held) < policy.backlog_limit \
                and partition.held_bytes < policy.held_partition_max_bytes \
                and self.held_bytes < policy.held_max_bytes:
            self.dispatch(partition, sm.BacklogDrained())

    def _tell_written(self, partition: Partition) -> None:
        event = sm.Wrote(partition.batch_first, partition.batch_next, partition.batch_records,
                         partition.batch_since, partition.batch_first_ts, partition.batch_last_ts)
        partition.batch_records = 0
        partition.state, _ = sm.transition(partition.state, event, self.policy)


def held_size(msg: Message) -> int:
    """A held record's bytes: its key, value and headers."""
    size = len(msg.value() or b"") + len(msg.key() or b"")
    headers: list[tuple[str, bytes | None]] | None = msg.headers()  # type: ignore[assignment]
    if headers:
        for name, value in headers:
            size += len(name) + len(value or b"")
    return size


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
