"""The consumer loop: consume a batch, turn records into outputs, and carry out what
the partitions' state machine decides. It decides nothing itself and never waits on
Kafka except in ``consume()``: commits, aborts, inits and lookups are jobs.

One iteration:
1. ``consume()`` a batch (rebalance callbacks run inside it);
2. settle: dispatch the events of finished jobs and of delivery reports;
3. process the batch, partition by partition in offset order;
4. tick: start the commits that are due, end backoffs, reclaim fenced partitions.

A batch is a unit of fetching, not of time (docs/state-machine.md, "Time bounds
the work"): between records ``process`` looks at the clock, and a checkpoint starts
the commits that fell due, beats the liveness heartbeat and ends the batch when the
replica stops. Records of a committing partition are held, in order, meanwhile.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter as Tally
from collections.abc import Iterable
from concurrent.futures import Future
from typing import cast

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from service.contract.processing import (
    OutputRefusedError,
    Processed,
    Result,
    process,
    refused,
    written_before,
)
from service.contract.records import Output, Record, Transform
from service.error_codes import DENIALS, LOOK_AGAIN
from service.errors import (
    DeniedError,
    FatalError,
    FencedError,
    KafkaOperationError,
    PoisonRecordError,
    RetriableError,
    TopicLimitPending,
    Where,
)
from service.kafka.cluster import OutputLimits
from service.kafka.errors import kafka_error, translate
from service.kafka.messages import to_record
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage import machine as sm
from service.stage.fetch_watch import FetchWatch
from service.stage.guarantees.guarantee import Committer, Job
from service.stage.jobs import Jobs
from service.stage.partition import Partition, TopicPartitionKey

log = structlog.get_logger(__name__)

_HOUSEKEEPING_EVERY_S = 1.0
# The longest stretch of records between two checkpoints (liveness beat, stop, due
# commits) when no transaction falls due sooner.
_CHECKPOINT_EVERY_S = 0.5
# A transaction due in the middle of a batch commits there once this share of the
# commit interval has passed too. A fast batch (500 records in a few ms) ends first
# and commits at its tick, as any batch; a commit in the middle holds the rest of the
# batch, and a held record costs a second pass (docs/benchmarks.md).
_GRACE = 0.1
_NO_LIMIT = 1 << 62
_STARTUP_PHASES = (sm.Phase.INITIALISING, sm.Phase.POSITIONING)
_ACTIVE = sm.Phase.ACTIVE
# Calls stuck in librdkafka past every deadline (CallStuck) each keep a job thread:
# past this many the replica fails, so that its orchestrator starts a fresh process.
_MAX_STUCK_CALLS = 4
# A transaction still open after this share of transaction.timeout.ms is warned about.
_NEAR_TIMEOUT = 0.5
_LOOKUP_RETRY_S = 0.2
_STABLE_READ_S = 5.0


class Loop:
    """One replica's consumer loop over the partitions it owns."""

    def __init__(self, settings: Settings, transform: Transform, metrics: Metrics,
                 health: Health, limits: OutputLimits, consumer: Consumer,
                 committer: Committer, policy: sm.Policy) -> None:
        self.settings = settings
        self.transform = transform
        self.metrics = metrics
        self.health = health
        self.limits = limits
        self.consumer = consumer
        self.committer = committer
        self.policy = policy
        self.jobs = Jobs()
        self.partitions: dict[TopicPartitionKey, Partition] = {}
        self.recorded: list[BaseException] = []
        self._topic_lookups: dict[str, Future[object]] = {}
        self._produced: Tally[str] = Tally()
        self._next_housekeeping = 0.0
        self._batch = 0  # consume() calls so far
        self._assigning_since: float | None = None
        self._transform_seconds = metrics.transform_seconds.observe
        self.fetch_watch = FetchWatch(settings.fetch_stall_s)
        self._fetch_check: tuple[dict[TopicPartitionKey, int], Future[object]] | None = None
        self.describe_requested = False  # set by SIGUSR1: log every partition's state
        self.stopping = False  # set by Stage.stop (a signal): the batch ends at the next record
        self._warned_near_timeout = False
        # A waiting phase lasting longer than a transaction could is worth a warning.
        self._stalled_after_s = max(policy.transaction_timeout_s, 30.0) + 30.0
        self._no_offset = OFFSET_END if settings.starts_at_end else OFFSET_BEGINNING

    # --- one iteration ------------------------------------------------------------

    def iterate(self) -> None:
        self.health.beat()
        self._batch += 1
        messages = self.consumer.consume(self.settings.batch_size,
                                         self.settings.poll_timeout_ms / 1000)
        if len(messages) < self.settings.batch_size:
            self.fetch_watch.short_batches += 1  # librdkafka's queue ran dry
        self.raise_recorded()
        now = time.monotonic()
        self.settle(now)
        if messages:
            self.process(messages, now)
        self.tick(time.monotonic())

    def settle(self, now: float) -> None:
        """Dispatch what finished beside the loop: jobs, delivery reports, lookups.
        Only the jobs finished by now: a commit that ends while held records drain
        waits for the next iteration, so the loop returns to ``consume()`` (taken as
        they came, a slow transform's partitions drained their whole backlogs here,
        commit after commit, past ``max.poll.interval.ms``)."""
        for partition, (event, error) in list(self.jobs.completions()):
            if error is not None:
                raise error
            if event is None:
                continue
            if self.partitions.get(partition.key) is partition:
                self.dispatch(partition, event)  # type: ignore[arg-type]
            else:
                self._abandoned(partition, event)  # type: ignore[arg-type]
        for key, reported in self.committer.poll(now):
            owner = self.partitions.get(key)
            if owner is not None:
                self.dispatch(owner, reported)
        for topic, future in list(self._topic_lookups.items()):
            if future.done():
                del self._topic_lookups[topic]
                for partition in list(self.partitions.values()):
                    if partition.waiting_topic == topic:
                        partition.waiting_topic = None
                        self.dispatch(partition, sm.TopicResolved(topic))

    def tick(self, now: float) -> None:
        policy = self.policy
        self._retry_seeks()
        for partition in list(self.partitions.values()):
            state = partition.state
            if partition.batch_records:
                self._tell_written(partition)
                state = partition.state
            if state.due(now, policy):
                self._warn_near_timeout(partition, now)
                self.dispatch(partition, sm.CommitDue(now))
            elif state.resume_at is not None or state.fenced_at is not None:
                self.dispatch(partition, sm.Tick(now))
        self._housekeeping(now)

    # --- records ----------------------------------------------------------------

    def process(self, messages: Iterable[Message], now: float,  # noqa: PLR0915 (inlined:
                saved: dict[int, list[Output]] | None = None) -> None:  # the hot path)
        """Process a batch, in offset order per partition.

        The hot path: a *flowing* partition (ACTIVE, no pause, nothing isolated or
        refused: ``PartitionState.flowing``, kept on the partition as its state
        changes) runs each record straight through ``processing.process``, and the
        records a fetch brought it in a row are written as one run
        (``Committer.write_run``), its bookkeeping done once. Anything that could
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
        was processed is released by the stop, the rest is left to the next owner."""
        partitions = self.partitions
        transform, max_bytes = self.transform, self.limits.lookup
        default_topic, dlq_topic = self.settings.output_topic, self.settings.dlq_topic or None
        observe, clock = self._transform_seconds, time.monotonic
        produced = self._produced
        owner: Partition | None = None  # the flowing partition whose run this is
        run: list[Processed] = []
        consumed = position = 0         # position: the owner's next offset, as of the run
        room = _NO_LIMIT                # records the owner's transaction may still take
        finished, check_at = now, self._next_checkpoint(now)  # the clock after each record
        for msg in messages:
            if finished >= check_at or len(run) >= room or self.stopping:
                consumed += self._write_run(owner, run, now)
                owner, now, room = None, clock(), _NO_LIMIT
                if self._checkpoint(now):
                    break  # stopping: the rest is left to the next owner
                check_at = self._next_checkpoint(now)
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
                if not partition.flowing or saved:
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

    def interrupt(self) -> None:
        """The replica stops (signal-handler safe): the batch ends after the record
        being transformed; what was processed is released by the stop."""
        self.stopping = True

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
            # and takes no record (a checkpoint at every record while it commits cost
            # the loop 2.5 times its CPU per record).
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

    def _warn_near_timeout(self, partition: Partition, now: float) -> None:
        """A transaction that starts its commit with half its time-out gone means a
        record's transform takes nearly as long as a transaction may: said once."""
        txn = partition.state.txn
        timeout_s = self.policy.transaction_timeout_s
        if txn is None or self._warned_near_timeout or \
                now - txn.opened_at < _NEAR_TIMEOUT * timeout_s:
            return
        self._warned_near_timeout = True
        age = now - txn.opened_at
        log.warning("transaction.near_timeout", topic=partition.topic,
                    partition=partition.partition, open_s=round(age, 3), records=txn.records,
                    seconds_per_record=round(age / max(txn.records, 1), 3),
                    transaction_timeout_ms=round(timeout_s * 1000),
                    note="one record's transform takes a large share of the transaction "
                         "time-out: raise TXSTAGE_TRANSACTION_TIMEOUT_MS (the broker's "
                         "transaction.max.timeout.ms bounds it) or make the transform faster; "
                         "past the time-out the coordinator aborts the transaction")

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
        if offset < partition.position or partition.seek_to is not None \
                or partition.seek_batch == self._batch:
            return False  # a stale fetch from before a seek
        if state.holding:
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
            self.dispatch(partition, sm.TopicUnknown(exc.topic))
            self._hold(partition, msg)

    def _dead_lettered(self, partition: Partition, record: Record, error: BaseException) -> None:
        self.metrics.dead_lettered.inc()
        log.warning("record.dead_lettered", topic=record.topic, partition=record.partition,
                    offset=record.offset,
                    transactional_id=self.committer.transactional_id(partition.key),
                    error_class=type(error).__name__, error=str(error))

    def _hold(self, partition: Partition, msg: Message,
              saved: dict[int, list[Output]] | None = None) -> None:
        """Hold a record, in order, with what the transform already yielded for it
        (``saved``, when a held record is held again: it is not transformed twice)."""
        if saved:
            yielded = saved.pop(msg.offset(), None)  # type: ignore[arg-type]
            if yielded is not None:
                partition.saved[msg.offset()] = yielded  # type: ignore[index]
        partition.held.append(msg)
        if len(partition.held) == self.policy.backlog_limit:
            self.dispatch(partition, sm.BacklogFull())

    def _tell_written(self, partition: Partition) -> None:
        event = sm.Wrote(partition.batch_first, partition.batch_next, partition.batch_records,
                         partition.batch_since, partition.batch_first_ts, partition.batch_last_ts)
        partition.batch_records = 0
        partition.state, _ = sm.transition(partition.state, event, self.policy)

    # --- the state machine's decisions -------------------------------------------

    def dispatch(self, partition: Partition, event: sm.Event) -> None:
        if partition.batch_records:
            self._tell_written(partition)
        error = getattr(event, "error", None)
        if isinstance(error, KafkaOperationError):
            self._error_metric(error)
        if (isinstance(error, KafkaOperationError) and error.code in LOOK_AGAIN) or any(
                f.code in LOOK_AGAIN for f in getattr(event, "failures", ())):
            self.limits.forget()  # was an output topic deleted? look each one up again
        before = partition.state
        partition.state, actions = sm.transition(before, event, self.policy)
        if partition.state.phase is not before.phase:
            partition.phase_since, partition.stalled_warned = time.monotonic(), False
            log.debug("partition.phase", topic=partition.topic, partition=partition.partition,
                      phase=partition.state.phase.value, on=type(event).__name__)
        for action in actions:
            self._execute(partition, action)

    def _execute(self, partition: Partition, action: sm.Action) -> None:
        match action:
            case sm.PausePartition():
                self.consumer.pause([partition.tp])
            case sm.ResumePartition():
                if partition.seek_to is None:  # else: once the seek lands
                    self.consumer.resume([partition.tp])
            case sm.Seek(offset):
                self._seek(partition, offset)
            case sm.StartInit(replacing):
                if not partition.releasing:
                    self.jobs.start(partition, self.committer.init(partition.key, replacing),
                                    startup=True)
            case sm.LookupPosition(after_commit):
                if not partition.releasing:
                    self.jobs.start(partition, self._lookup_position(partition, after_commit),
                                    startup=True)
            case sm.StartCommit(txn):
                self._run(partition, self.committer.commit(
                    partition.key, txn, self._take_group_metadata))
            case sm.StartAbort(txn):
                self._run(partition, self.committer.abort(partition.key, txn))
            case sm.CloseProducer():
                self.jobs.spawn(self.committer.detach(partition.key))
            case sm.DropProducer():
                # Closed once the stuck call returns, if it ever does (a close could
                # hang the same way); a job that had not started is cancelled.
                stuck = self.jobs.write_off(partition, self.committer.detach(partition.key))
                log.error("producer.stuck", topic=partition.topic, partition=partition.partition,
                          transactional_id=self.committer.transactional_id(partition.key),
                          stuck_s=round(time.monotonic() - partition.phase_since, 1),
                          stuck_calls=stuck,
                          note="a thread stays blocked in librdkafka; the producer is "
                               "replaced if the partition is still ours")
                if stuck >= _MAX_STUCK_CALLS:
                    raise FatalError(Where("jobs", None, partition.topic, partition.partition),
                                     KafkaError(KafkaError._FAIL,
                                                f"{stuck} calls on producers are stuck in "
                                                f"librdkafka past their deadlines; a fresh "
                                                f"process is needed"))
            case sm.Finish(txn, commit, reason, deadline):
                work = self.committer.finish(partition.key, txn, commit, reason,
                                             self._take_group_metadata, deadline)
                if work is not None:
                    self.jobs.start(partition, work)
            case sm.Abandon():
                self.jobs.abandon(partition, self.committer.detach(partition.key))
            case sm.DrainHeld():
                held, partition.held = partition.held, []
                saved, partition.saved = partition.saved, {}
                if held and not partition.releasing:
                    self.process(held, time.monotonic(), saved)
            case sm.DropHeld():
                partition.held.clear()
                partition.saved.clear()
            case sm.LookupTopic(topic):
                self._lookup_topic(partition, topic)
            case sm.Fail(error):
                raise error
            case _:
                self._report(partition, action)

    def _abandoned(self, partition: Partition, event: sm.Event) -> None:
        """The end of a job whose partition was given up while it ran (lost while
        committing, say): nothing is left to decide, but a fence it found is reported as
        any other is. (A paused replica that resumes often starts the commits that fell
        due meanwhile before it hears its partitions are lost; they meet its successor's
        fence, which the operator must see.)"""
        error = getattr(event, "error", None)
        if isinstance(error, FencedError):
            self.metrics.producers_fenced.inc()
            if isinstance(event, sm.CommitFailed):
                self.metrics.aborted.labels(reason="fenced").inc()
            log.warning("producer.fenced", topic=partition.topic, partition=partition.partition,
                        transactional_id=self.committer.transactional_id(partition.key),
                        on="abandoned", error=str(error))

    def _end_to_end(self, txn: sm.Txn) -> None:
        """A committed transaction's outputs are visible to read_committed readers now:
        how long after its first and its last input record were appended (by their
        timestamps: the producer's clock for CreateTime, the broker's for LogAppendTime)."""
        now_ms = time.time() * 1000
        for label, stamp in (("first", txn.first_ts_ms), ("last", txn.last_ts_ms)):
            if stamp >= 0:
                self.metrics.end_to_end_seconds.labels(record=label).observe(
                    max(now_ms - stamp, 0.0) / 1000)

    def _take_group_metadata(self) -> object:
        """The consumer's group metadata, for a committer to take as its commit
        starts, on the loop thread (Committer.commit): the consumer must not be called
        from another thread (its calls there wait while this thread sits in
        consume()). At-least-once never takes it: it cost 0.1-0.3 ms a commit."""
        return self.consumer.consumer_group_metadata()

    def _run(self, partition: Partition, work: object) -> None:
        """A committer answer: an event now, or a job to run beside the loop."""
        if callable(work):
            self.jobs.start(partition, work)
        else:
            self.dispatch(partition, work)  # type: ignore[arg-type]

    def _seek(self, partition: Partition, offset: int) -> None:
        """Fetch the partition from ``offset`` (< 0: none committed), and make sure of it.

        librdkafka refuses a seek with _STATE while the partition is not fetching yet
        (just assigned, its own committed-offset query still out). Its fetcher then
        starts where that query says, but a refused seek also leaves librdkafka's
        "application position" as it was, and every later pause moves the fetcher to
        that position (rdkafka_partition.c). After a rebalance served inside consume()
        that position can belong to records of the previous assignment, far ahead
        (rdkafka_queue.c updates it after the callbacks): a chaos campaign saw a
        partition resume 1 474 records past the offset Kafka had committed. So a
        refused seek keeps the partition paused and is retried until it lands, and the
        first record fetched after it must be at ``offset``: fetched from beyond it, the
        seek is made once more (a gap that persists is real: transaction markers,
        compaction, retention)."""
        if offset < 0 and partition.started_at is not None:
            offset = partition.started_at  # nothing committed yet: where it started
        partition.position = max(offset, 0)
        partition.seek_to = partition.sought = offset
        partition.fetched_end = None
        partition.check_first = True
        partition.seek_batch = self._batch  # what this batch holds was fetched before it
        partition.rechecked = None
        log.debug("partition.positioned", topic=partition.topic, partition=partition.partition,
                  committed_offset=offset)
        if not self._land_seek(partition):
            log.info("partition.seek_deferred", topic=partition.topic,
                     partition=partition.partition, offset=offset,
                     note="librdkafka is not fetching it yet: paused, the seek is retried")

    def _land_seek(self, partition: Partition) -> bool:
        offset = partition.seek_to
        if offset is None:
            return True
        target = offset if offset >= 0 else self._no_offset
        try:
            self.consumer.seek(TopicPartition(partition.topic, partition.partition, target))
        except KafkaException as exc:
            error = kafka_error(exc)
            if error is None or error.code() not in (KafkaError._STATE,
                                                     KafkaError._PREV_IN_PROGRESS):
                raise translate(exc, Where("seek", None, partition.topic, partition.partition,
                                           offset)) from exc
            self.consumer.pause([partition.tp])  # until the seek lands (tick retries it)
            partition.refresh_flowing()
            return False
        partition.seek_to = None
        partition.refresh_flowing()
        return True

    def _retry_seeks(self) -> None:
        for partition in self.partitions.values():
            if partition.seek_to is not None and not partition.releasing \
                    and self._land_seek(partition) and not partition.state.paused:
                self.consumer.resume([partition.tp])

    def _check_first(self, partition: Partition, offset: int) -> bool:
        """The first record after a seek to ``partition.position``; False when it came
        from beyond it and the seek is made again. Once more from beyond it, the gap is
        real (transactional input: the committed offset is often a commit marker)."""
        expected = partition.position
        if partition.sought < 0 and self._no_offset == OFFSET_END:
            # Nothing committed, auto.offset.reset=latest: where the log ended is not
            # known here (checked against 0 it would be sought again, to 0: the whole
            # history). This record is where the partition starts, and where it goes
            # back to while nothing is committed (an abort, a poison retry): sought
            # to the end again, the records since would be skipped.
            partition.started_at = partition.position = offset
            expected = offset
        if offset > expected and partition.rechecked is None:
            self._seek(partition, expected)
            partition.rechecked = offset
            return False
        if partition.rechecked is not None and offset < partition.rechecked:
            log.warning("partition.fetch_position_corrected", topic=partition.topic,
                        partition=partition.partition, position=expected,
                        fetched_first=partition.rechecked,
                        note="the fetcher started beyond the committed offset; sought again")
            self.metrics.kafka_errors.labels(op="fetch_position", action="seek").inc()
        partition.check_first, partition.rechecked = False, None
        partition.refresh_flowing()
        return True

    def _lookup_position(self, partition: Partition, after_commit: bool = False) -> Job:
        """The offset committed in Kafka. Asked with RequireStable, so a transaction
        still holding offsets for the partition settles first. This runs only after
        this replica's own init_transactions or abort_transaction returned, and both
        return only once every earlier transaction of the partition's id is
        complete; so when the broker does not answer a stable read in time (seen
        after a broker restart), the plain committed offset is just as right. Not
        ``after_commit`` (a poison retry's reposition): commit_transaction returns
        once the coordinator has decided, before the markers that apply the
        transaction's offsets are written, and a plain read then may give the offset
        before it (its records would be processed twice). That lookup reads stable
        only, until the deadline."""
        topic, number = partition.key
        deadline = time.monotonic() + self.settings.transaction_timeout_ms / 1000 + 30
        cluster, group = self.limits.cluster, self.settings.group_id

        def job() -> sm.Event:
            stable = True
            while True:
                try:
                    offset = cluster.committed_offset(group, topic, number, require_stable=stable,
                                                      timeout_s=_STABLE_READ_S)
                    return sm.Positioned(offset, time.monotonic())
                except KafkaOperationError as error:
                    pending = isinstance(error, RetriableError) or \
                        error.code == KafkaError.UNSTABLE_OFFSET_COMMIT
                    if not pending or time.monotonic() >= deadline:
                        return sm.PositionFailed(error)
                    stable = after_commit or error.code != KafkaError._TIMED_OUT
                    log.info("position.retry", topic=topic, partition=number, error=str(error),
                             stable=stable)
                    time.sleep(_LOOKUP_RETRY_S)
        return job

    def _lookup_topic(self, partition: Partition, topic: str) -> None:
        partition.waiting_topic = topic
        if topic not in self._topic_lookups:
            self._topic_lookups[topic] = self.jobs.submit(lambda: self.limits.resolve(topic))

    # --- reports: logs and metrics ------------------------------------------------

    def _report(self, partition: Partition, action: sm.Action) -> None:
        where = {"topic": partition.topic, "partition": partition.partition,
                 "transactional_id": self.committer.transactional_id(partition.key)}
        match action:
            case sm.Committed(txn, seconds):
                if seconds >= 0:  # at-least-once seals a window: its offsets commit
                    self.metrics.commit_seconds.observe(seconds)  # later, counted then
                    self._end_to_end(txn)
                    self.metrics.committed.inc()
                    self.metrics.last_commit.set_to_current_time()
                self.metrics.records_per_transaction.observe(txn.records)
                # The commit trail (debug: one line per transaction) for tracing a
                # partition's committed offsets after the fact, as a soak needs.
                log.debug("transaction.committed", **where, first_offset=txn.first,
                          next_offset=txn.next, records=txn.records)
            case sm.Aborted("poison", _, attempt, cause):
                self.metrics.aborted.labels(reason="poison").inc()
                log.error("record.poison", **where, attempt=attempt,
                          max_attempts=self.policy.max_record_attempts, error=cause)
            case sm.Aborted(reason, txn, streak, cause):
                self.metrics.aborted.labels(reason=reason).inc()
                log.warning("transaction.aborted", **where, reason=reason, streak=streak,
                            first_offset=txn.first if txn else None,
                            last_offset=txn.last if txn else None, error=cause)
            case sm.Fenced(txn, timed_out, cause):
                self.metrics.producers_fenced.inc()
                if txn is not None:
                    self.metrics.aborted.labels(reason="timed_out" if timed_out else "fenced").inc()
                log.warning("producer.fenced", **where, timed_out=timed_out, error=cause)
                self.report_partitions()
            case sm.Isolating(first, until):
                log.warning("partition.isolating", **where, offsets=f"{first}..{until - 1}")
            case sm.RecordRefused(offset, cause):
                log.warning("record.output_refused", **where, offset=offset, error=cause)
            case sm.Reclaiming():
                log.info("producer.reclaimed", **where)
            case _:
                raise TypeError(f"no executor for {action!r}")

    def _error_metric(self, error: KafkaOperationError) -> None:
        self.metrics.kafka_errors.labels(op=error.where.op, action=error.action).inc()

    def report_partitions(self) -> None:
        """Readiness: a partition is ready once it processes records."""
        ready = sum(1 for p in self.partitions.values() if p.state.ready)
        self.health.partitions(len(self.partitions), ready)

    def _housekeeping(self, now: float) -> None:
        if self._assigning_since is not None and all(
                p.state.ready for p in self.partitions.values()):
            self.metrics.rebalance_seconds.observe(now - self._assigning_since)
            self._assigning_since = None
            self.report_partitions()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + _HOUSEKEEPING_EVERY_S
        self.report_partitions()
        self._watch_stalls(now)
        if self.fetch_watch.stall_after_s:
            self._watch_fetching(now)
        self.metrics.oldest_open_transaction.set(
            max((p.state.age(now) for p in self.partitions.values()), default=0))
        for partition in self.partitions.values():
            high = self._fetched_high(partition.tp)
            if high >= 0 and partition.position >= 0:
                self.metrics.consumer_lag.labels(partition.topic, str(partition.partition)).set(
                    max(high - partition.read_to(), 0))

    def _watch_stalls(self, now: float) -> None:
        """Log each partition on request (SIGUSR1), and warn once per phase about a
        partition that has waited in a phase longer than any transaction may last."""
        if self.describe_requested:
            self.describe_requested = False
            log.info("stage.partitions", jobs_running=self.jobs.running,
                     partitions=[p.describe(now) for p in self.partitions.values()])
        for partition in list(self.partitions.values()):
            phase = partition.state.phase
            if phase in (sm.Phase.COMMITTING, sm.Phase.ABORTING) and partition.job is not None \
                    and now - partition.phase_since > self.policy.stuck_after_s:
                self.dispatch(partition, sm.CallStuck(now))
                continue
            if partition.stalled_warned or (phase is sm.Phase.ACTIVE
                                            and partition.seek_to is None):
                continue  # (ACTIVE waiting for its seek to land is waiting too)
            if now - partition.phase_since > self._stalled_after_s:
                partition.stalled_warned = True
                log.warning("partition.stalled", **partition.describe(now))

    def _watch_fetching(self, now: float) -> None:
        """Restart the fetcher of a partition librdkafka left unfetched: see
        fetch_watch.py. Kafka is asked beside the loop, one question at a time."""
        watch = self.fetch_watch
        if self._fetch_check is not None:
            asked, future = self._fetch_check
            if not future.done():
                return
            self._fetch_check = None
            high = cast("dict[TopicPartitionKey, int]", future.result() or {})
            fetched = {key: self._fetched_high(TopicPartition(*key)) for key in asked}
            for key in watch.stalled(asked, high, fetched, now):
                partition = self.partitions.get(key)
                if partition is not None and self._should_fetch(partition):
                    self._restart_fetch(partition, high.get(key, -1), fetched[key])
        idle = watch.idle(((p.key, p.position, self._should_fetch(p))
                           for p in self.partitions.values()), now)
        if idle:
            cluster, keys = self.limits.cluster, list(idle)
            self._fetch_check = (idle, self.jobs.spawn(
                lambda: cluster.high_watermarks(keys, timeout_s=_STABLE_READ_S)))

    def _fetched_high(self, tp: TopicPartition) -> int:
        """The high watermark of the partition's last fetch response (-1: none)."""
        _, high = self.consumer.get_watermark_offsets(tp, cached=True)
        return high if high is not None and high >= 0 else -1

    @staticmethod
    def _should_fetch(partition: Partition) -> bool:
        """Nothing but librdkafka stands between the partition and its next record:
        ACTIVE, no pause, no seek pending, nothing held or running."""
        state = partition.state
        return state.phase is sm.Phase.ACTIVE and not state.pauses \
            and partition.seek_to is None and not partition.releasing \
            and not partition.held and partition.job is None

    def _restart_fetch(self, partition: Partition, high: int, fetched_high: int) -> None:
        log.warning("partition.fetch_stalled", topic=partition.topic,
                    partition=partition.partition, position=partition.position,
                    high_watermark=high, fetched_high_watermark=fetched_high,
                    note="no fetch response for the partition although Kafka holds offsets "
                         "past what librdkafka last saw: its fetcher is restarted (pause, "
                         "resume, seek)")
        self.metrics.fetch_stalls.inc()
        unknown = partition.sought < 0 and partition.position == 0  # nothing read yet
        self.consumer.pause([partition.tp])
        self.consumer.resume([partition.tp])
        self._seek(partition, partition.sought if unknown else partition.position)

    # --- partitions coming and going (called by the rebalance listener) ----------

    def assign(self, partitions: list[TopicPartition]) -> None:
        now = time.monotonic()
        self._assigning_since = self._assigning_since or now
        for tp in partitions:
            partition = Partition(tp.topic, tp.partition)
            partition.phase_since = now
            self.partitions[partition.key] = partition
            partition.state, actions = sm.assigned()
            for action in actions:
                self._execute(partition, action)
        self.report_partitions()

    def release(self, keys: Iterable[TopicPartitionKey], *, lost: bool, reason: str,
                deadline: float) -> None:
        """Finish and forget these partitions by ``deadline``: first let the work in
        flight end (revoke while committing or aborting), then release each as the
        state machine says, in parallel, and wait for that too."""
        leaving = [self.partitions[key] for key in keys if key in self.partitions]
        for partition in leaving:
            partition.releasing = True
        # An init's or a position lookup's result is discarded by the release: their
        # jobs end on their own (an init's producer is closed then), nobody waits.
        startup = {partition.key: partition.job for partition in leaving
                   if partition.state.phase in _STARTUP_PHASES}
        for partition in leaving:
            if partition.key in startup:
                continue
            completion = self.jobs.wait(partition, deadline)
            if completion is None:
                continue
            event, error = completion
            if error is not None:
                self.recorded.append(error)
            elif event is not None:
                self._dispatch_recording(partition, event)  # type: ignore[arg-type]
        now = time.monotonic()
        for partition in leaving:
            self._dispatch_recording(partition, sm.Released(lost, now, reason, deadline))
        for partition in leaving:
            # A Finish that overruns closes its own producer. What a job that ended
            # meanwhile found is still reported (a commit that met the successor's fence
            # as a paused replica resumed): taken here, its completion never reached
            # ``settle`` and the fence went unsaid.
            completion = None if partition.job is startup.get(partition.key) else \
                self.jobs.wait(partition, deadline)
            if completion is not None and completion[0] is not None:
                self._abandoned(partition, completion[0])  # type: ignore[arg-type]
            del self.partitions[partition.key]
            with contextlib.suppress(KeyError):
                self.metrics.consumer_lag.remove(partition.topic, str(partition.partition))
        self.report_partitions()

    def _dispatch_recording(self, partition: Partition, event: sm.Event) -> None:
        try:
            self.dispatch(partition, event)
        except BaseException as exc:  # never raise inside a librdkafka callback
            self.recorded.append(exc)

    # --- errors -----------------------------------------------------------------

    def record(self, exc: BaseException, where: str) -> None:
        """Keep an error from a callback for the loop thread to raise."""
        log.error("callback.failed", where=where, error=str(exc), error_class=type(exc).__name__)
        self.recorded.append(exc)

    def raise_recorded(self) -> None:
        if self.recorded:
            raise self.recorded[0]

    def _consume_error(self, error: KafkaError, msg: Message) -> None:
        topic, number = msg.topic(), msg.partition()
        if error.code() == KafkaError._PARTITION_EOF:
            # The fetcher reached the end: past commit markers and aborted records,
            # which take offsets but are never delivered (the lag gauge's end).
            partition = self.partitions.get((topic, number))  # type: ignore[arg-type]
            if partition is not None:
                partition.fetched_end = (partition.position, msg.offset())  # type: ignore[assignment]
            return
        if error.code() in DENIALS:  # a missing ACL never heals by itself
            raise DeniedError(Where("consume", topic=topic, partition=number), error)
        if error.fatal():
            raise FatalError(Where("consume"), error)
        log.warning("kafka.consume_error", code=error.name(), error=error.str())


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
