"""The stage: consume → transform → produce, one transaction per input partition.

The loop thread owns the consumer: it consumes a batch, runs the transform,
queues outputs into each partition's open transaction, then commits the
partitions that are due, in parallel. Rebalance callbacks run inside
``consume()`` on the same thread; librdkafka's other callbacks only record,
and the loop raises what they recorded.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter as Tally
from collections.abc import Callable

import structlog
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from service.errors import (
    AbortableError,
    FatalError,
    FencedError,
    KafkaOperationError,
    PoisonRecordError,
    RetriableError,
    Where,
    translated,
)
from service.health import Health
from service.kafka_config import consumer_config
from service.logs import librdkafka_logger
from service.messages import to_record
from service.metrics import Metrics
from service.pool import CommitOutcome, ProducerPool, TopicPartitionKey
from service.processing import OutputRefusedError, process, refused
from service.records import Transform
from service.settings import Settings
from service.task import PartitionTask

log = structlog.get_logger(__name__)

_HOUSEKEEPING_EVERY_S = 1.0
_MAX_BACKOFF_S = 30.0
# A failed delivery often costs two aborts (the failure, then librdkafka's
# epoch bump), so allow several before deciding the input itself is the cause.
_MAX_ABORT_STREAK = 10
# Records held per partition while its commit runs, before the partition pauses.
_BACKLOG_LIMIT = 5_000


class Stage:
    """One replica of the exactly-once stage."""

    def __init__(self, settings: Settings, transform: Transform, metrics: Metrics,
                 health: Health, max_bytes: Callable[[str], int],
                 pool: ProducerPool | None = None) -> None:
        self.settings = settings
        self.transform = transform
        self.metrics = metrics
        self.health = health
        self.max_bytes = max_bytes
        self.pool = pool or ProducerPool(settings, metrics)
        self.stopping = False
        self._recorded: list[BaseException] = []
        self._dirty = False
        self._next_housekeeping = 0.0
        config = consumer_config(settings)
        self._session_timeout_s = float(str(config.get("session.timeout.ms", 45_000))) / 1000
        self.consumer = Consumer({**config, "error_cb": self._on_client_error,
                                  "logger": librdkafka_logger("consumer")})

    # --- the loop --------------------------------------------------------------

    def run(self) -> None:
        """Process until ``stop()``; then commit what is open and leave the group."""
        self.consumer.subscribe(list(self.settings.input_topics), on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_lost)
        log.info("stage.started", topics=list(self.settings.input_topics),
                 guarantee=self.settings.guarantee, group_id=self.settings.group_id)
        try:
            while not self.stopping:
                self.iterate()
        except BaseException:
            self._close_dirty()
            raise
        self._close_clean()

    def stop(self) -> None:
        """Ask the loop to finish after the current batch (signal-handler safe)."""
        self.stopping = True

    def iterate(self) -> None:
        self.health.beat()
        messages = self.consumer.consume(self.settings.batch_size,
                                         self.settings.poll_timeout_ms / 1000)
        self._raise_recorded()
        for task in self.pool:
            task.discard_batch = False
        if messages:
            self._process(messages)
        self._commit_due(time.monotonic())
        self._housekeeping()

    def _process(self, messages: list[Message]) -> None:
        consumed, dead = 0, 0
        produced: Tally[str] = Tally()
        observe = self.metrics.transform_seconds.observe
        settings = self.settings
        for msg in messages:
            error = msg.error()
            if error is not None:
                self._on_consume_error(error)
                continue
            task = self.pool.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
            if task is None or task.discard_batch or task.fenced_at is not None:
                continue
            if task.committing is not None:
                self._hold(task, msg)
                continue
            if task.isolate_until is not None and self._one_at_a_time(task, msg):
                continue
            record = to_record(msg)
            offset = record.offset
            if task.position is None:
                task.position = offset
            consumed += 1
            started = time.perf_counter()
            try:
                if offset in task.refused:
                    result = refused(record, OutputRefusedError(task.refused[offset]),
                                     settings.dlq_topic or None)
                else:
                    result = process(self.transform, record, default_topic=settings.output_topic,
                                     dlq_topic=settings.dlq_topic or None,
                                     max_bytes=self.max_bytes)
            except PoisonRecordError as exc:
                self._poison(task, exc)
                continue
            observe(time.perf_counter() - started)
            if result.error is not None:
                dead += 1
                log.warning("record.dead_lettered", topic=record.topic,
                            partition=record.partition, offset=offset,
                            transactional_id=task.transactional_id,
                            error_class=type(result.error).__name__, error=str(result.error))
            try:
                task.write(offset, result.outputs)
            except KafkaOperationError as exc:
                self._on_task_error(task, exc)
                continue
            for out in result.outputs:
                produced[out.topic] += 1
        self.metrics.consumed.inc(consumed)
        if dead:
            self.metrics.dead_lettered.inc(dead)
        for topic, count in produced.items():
            self.metrics.produced.labels(topic=topic).inc(count)

    # --- commits -----------------------------------------------------------------

    def _commit_due(self, now: float) -> None:
        """Finish the commits that completed, then start those now due.

        A commit runs on the pool while the loop goes on with the other
        partitions; records of the committing partition wait, in order, in its
        backlog (see ``_hold``) and are processed as soon as the commit returns.
        """
        self._collect_commits()
        interval = self.settings.commit_interval_ms / 1000
        limit = self.settings.commit_max_records
        due = [t for t in self.pool if t.txn is not None and t.fenced_at is None
               and t.committing is None and (t.commit_now or t.due(now, interval, limit))]
        if not due:
            return
        if self.pool.shared is not None:
            self._commit_delivered(due, self.pool.shared)
            return
        group_metadata = self.consumer.consumer_group_metadata()
        for task in due:
            task.commit_now = False
            task.committing = self.pool.submit_commit(task, group_metadata)

    def _hold(self, task: PartitionTask, msg: Message) -> None:
        """Keep a record that arrived while its partition commits; past a bound,
        pause the partition so a slow commit cannot pile records up in memory."""
        task.backlog.append(msg)
        if len(task.backlog) >= _BACKLOG_LIMIT and not task.paused_for_backlog:
            task.paused_for_backlog = True
            self.consumer.pause([TopicPartition(task.topic, task.partition)])

    def _one_at_a_time(self, task: PartitionTask, msg: Message) -> bool:
        """Below ``isolate_until`` a transaction holds one record, so the next refusal
        names its record. True when ``msg`` must wait for the open one to commit."""
        isolate_until = task.isolate_until
        assert isolate_until is not None
        if int(msg.offset() or 0) >= isolate_until:
            task.isolate_until = None  # past the range that held the refused output
            return False
        if task.txn is None:
            return False
        task.commit_now = True
        self._hold(task, msg)
        return True

    def _collect_commits(self, *, wait: bool = False,
                         keys: set[TopicPartitionKey] | None = None, settle: bool = False) -> None:
        """Take the outcome of finished (``wait``: of all) in-flight commits.

        ``settle``: the partitions are leaving (revoke, lost, shutdown): count
        successes, log failures, drop backlogs; the next owner starts from the
        committed offset either way.
        """
        for task in self.pool:
            future = task.committing
            if future is None or (keys is not None and task.key not in keys):
                continue
            if not wait and not future.done():
                continue
            outcome = future.result()
            task.committing = None
            if settle:
                task.backlog.clear()
                self._settle(outcome)
                continue
            self._after_commit(outcome)
            self._drain_backlog(task)

    def _settle(self, outcome: CommitOutcome) -> None:
        if outcome.error is None:
            self._after_commit(outcome)
        else:
            log.warning("transaction.commit_failed", topic=outcome.task.topic,
                        partition=outcome.task.partition,
                        transactional_id=outcome.task.transactional_id, error=str(outcome.error))

    def _drain_backlog(self, task: PartitionTask) -> None:
        backlog, task.backlog = task.backlog, []
        if task.paused_for_backlog:
            task.paused_for_backlog = False
            if task.resume_at is None and task.fenced_at is None:
                self.consumer.resume([TopicPartition(task.topic, task.partition)])
        if backlog and task.fenced_at is None and self.pool.get(task.key) is task:
            self._process(backlog)

    def _commit_delivered(self, due: list[PartitionTask], producer: Producer) -> None:
        """At-least-once: wait for delivery, then commit consumer offsets. On a
        failed delivery rewind instead, and the outputs are sent again."""
        if not due:
            return
        started = time.monotonic()
        undelivered = producer.flush(self.settings.transaction_timeout_ms / 1000)
        error = self.pool.deliveries.take()
        if error is not None or undelivered:
            self.metrics.aborted.labels(reason="abortable_error").inc(len(due))
            log.warning("delivery.failed", undelivered=undelivered,
                        error=error.str() if error else "flush timed out")
            for task in due:
                first = task.forget()
                if first is not None:
                    self._rewind(task, first)
            return
        batches = [task.delivered() for task in due]
        offsets = [TopicPartition(t.topic, t.partition, b.next_offset)
                   for t, b in zip(due, batches, strict=True)]
        with translated(Where("commit_offsets")):
            self.consumer.commit(offsets=offsets, asynchronous=False)
        seconds = time.monotonic() - started
        for batch in batches:
            self.metrics.commit_seconds.observe(seconds)
            self.metrics.committed.inc()
            self.metrics.records_per_transaction.observe(batch.records)
        self.metrics.last_commit.set_to_current_time()

    def _after_commit(self, outcome: CommitOutcome) -> None:
        task, txn, error = outcome.task, outcome.committed, outcome.error
        task.commit_now = False
        if txn is not None:
            if task.refused:
                task.refused = {o: e for o, e in task.refused.items() if o >= txn.next_offset}
            self.metrics.commit_seconds.observe(outcome.seconds)
            self.metrics.committed.inc()
            self.metrics.records_per_transaction.observe(txn.records)
            self.metrics.last_commit.set_to_current_time()
            return
        assert error is not None
        self._on_task_error(task, error)

    def _on_task_error(self, task: PartitionTask, error: KafkaOperationError) -> None:
        """Act on a failed Kafka call for one partition, as its error class says."""
        self.metrics.kafka_errors.labels(op=error.where.op, action=error.action).inc()
        if isinstance(error, AbortableError):
            self._abort(task, "abortable_error", error)
        elif isinstance(error, FencedError):
            self._fenced(task, error)
        else:  # retriable past its deadline, or fatal: nothing safe is left to try
            if isinstance(error, RetriableError) and error.where.op == "commit_transaction":
                task.commit_uncertain = True  # it may have committed: never abort it
            raise error

    def _abort(self, task: PartitionTask, reason: str, cause: BaseException) -> None:
        """Abort the partition's transaction and rewind to its first offset."""
        last = task.txn.next_offset - 1 if task.txn is not None else None
        records = task.txn.records if task.txn is not None else 0
        try:
            first = task.abort()
        except FencedError as exc:
            self._fenced(task, exc)
            return
        self.metrics.aborted.labels(reason=reason).inc()
        task.abort_streak += 1
        log.warning("transaction.aborted", topic=task.topic, partition=task.partition,
                    transactional_id=task.transactional_id, reason=reason, rewind_to=first,
                    streak=task.abort_streak, error=str(cause))
        if task.abort_streak >= _MAX_ABORT_STREAK:  # the same input keeps failing
            cause.add_note(f"{task.topic}/{task.partition}: {task.abort_streak} aborts in a row; "
                           f"the last covered input offsets {first}..{last}")
            raise cause
        if first is not None and last is not None and _refusal(cause):
            self._find_refused(task, first, last, records, cause)
        if first is not None:
            self._rewind(task, first)
        if task.abort_streak > 1:  # the first retry is immediate; later ones back off
            self._back_off(task, task.abort_streak - 1)

    def _find_refused(self, task: PartitionTask, first: int, last: int, records: int,
                      cause: BaseException) -> None:
        """The broker refused an output. Alone in its transaction, the record is the
        culprit: it will be dead-lettered (or fail the replica without a DLQ). Among
        others, redo the range one record per transaction to find it."""
        if records == 1:
            task.refused[first] = str(cause)
            log.warning("record.output_refused", topic=task.topic, partition=task.partition,
                        offset=first, transactional_id=task.transactional_id, error=str(cause))
        else:
            task.isolate_until = max(task.isolate_until or 0, last + 1)
            log.warning("partition.isolating", topic=task.topic, partition=task.partition,
                        transactional_id=task.transactional_id, offsets=f"{first}..{last}")

    def _fenced(self, task: PartitionTask, error: KafkaOperationError) -> None:
        """Another producer owns this transactional.id now: never publish under it again.

        Either another replica took the partition, or the coordinator aborted a
        transaction that outlived transaction.timeout.ms (reason ``timed_out``)."""
        now = time.monotonic()
        timed_out = task.age(now) >= self.settings.transaction_timeout_ms / 1000
        first = task.forget()
        task.producer.close()
        task.fenced_at = now
        self.metrics.producers_fenced.inc()
        if first is not None:
            self.metrics.aborted.labels(reason="timed_out" if timed_out else "fenced").inc()
            task.position = first
        task.discard_batch = True
        self.consumer.pause([TopicPartition(task.topic, task.partition)])
        self._report_partitions()
        log.warning("producer.fenced", topic=task.topic, partition=task.partition,
                    transactional_id=task.transactional_id, rewind_to=task.position,
                    error=str(error))

    def _poison(self, task: PartitionTask, exc: PoisonRecordError) -> None:
        """No dead-letter topic: commit the good prefix, back off, retry, then give up."""
        if task.poison_offset != exc.offset:
            task.poison_offset, task.poison_attempts = exc.offset, 0
        task.poison_attempts += 1
        self.metrics.aborted.labels(reason="poison").inc()
        log.error("record.poison", topic=exc.topic, partition=exc.partition, offset=exc.offset,
                  transactional_id=task.transactional_id, attempt=task.poison_attempts,
                  max_attempts=self.settings.max_record_attempts, error=str(exc.cause))
        if task.poison_attempts >= self.settings.max_record_attempts:
            raise exc
        # The record's outputs were never produced, so what is open is a healthy
        # prefix: commit it now and retry from the poison record itself.
        task.commit_now = task.txn is not None
        self._rewind(task, exc.offset)
        self._back_off(task, task.poison_attempts)

    def _back_off(self, task: PartitionTask, attempt: int) -> None:
        """Pause the partition for an exponential backoff; housekeeping resumes it."""
        backoff = min(self.settings.retry_backoff_ms / 1000 * 2 ** (attempt - 1), _MAX_BACKOFF_S)
        task.resume_at = time.monotonic() + backoff
        self.consumer.pause([TopicPartition(task.topic, task.partition)])

    def _rewind(self, task: PartitionTask, offset: int) -> None:
        """Seek back: Kafka does not rewind an aborted transaction's input for us."""
        task.position = offset
        task.discard_batch = True
        task.backlog.clear()
        with translated(Where("seek", task.transactional_id, task.topic, task.partition, offset)):
            self.consumer.seek(TopicPartition(task.topic, task.partition, offset))

    # --- housekeeping ------------------------------------------------------------

    def _housekeeping(self) -> None:
        now = time.monotonic()
        for task in self.pool:
            if task.resume_at is not None and now >= task.resume_at:
                task.resume_at = None
                self.consumer.resume([TopicPartition(task.topic, task.partition)])
            elif task.fenced_at is not None and now - task.fenced_at > self._session_timeout_s:
                self._reclaim(task)
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + _HOUSEKEEPING_EVERY_S
        self.metrics.oldest_open_transaction.set(max((t.age(now) for t in self.pool), default=0))
        self._update_lag()

    def _reclaim(self, fenced: PartitionTask) -> None:
        """Fenced, yet still assigned a session time-out later: the consumer really
        owns the partition (the coordinator had timed our transaction out), so a
        new producer takes over and the partition resumes from its committed offset.
        Waiting a session time-out first keeps a zombie from fencing the real owner."""
        task = self.pool.replace(fenced)
        position = fenced.position
        log.info("producer.reclaimed", topic=task.topic, partition=task.partition,
                 transactional_id=task.transactional_id, resume_from=position)
        tp = TopicPartition(task.topic, task.partition)
        if position is not None:
            self._rewind(task, position)
        self.consumer.resume([tp])
        self._report_partitions()

    def _update_lag(self) -> None:
        for task in self.pool:
            tp = TopicPartition(task.topic, task.partition)
            _, high = self.consumer.get_watermark_offsets(tp, cached=True)
            if high is not None and high >= 0 and task.position is not None:
                self.metrics.consumer_lag.labels(task.topic, str(task.partition)).set(
                    max(high - task.position, 0))

    # --- rebalance callbacks (run inside consume(), on the loop thread) ---------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        started = time.monotonic()
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self.metrics.rebalances.labels(kind="assigned").inc()
        try:
            self.pool.open(keys)
        except BaseException as exc:
            self._record(exc, "rebalance")
        ready = [tp for tp in partitions if self.pool.get((tp.topic, tp.partition))]
        consumer.incremental_assign(ready)
        seconds = time.monotonic() - started
        self.metrics.rebalance_seconds.observe(seconds)
        self.health.joined(True)
        self._report_partitions()
        log.info("partitions.assigned", partitions=_names(keys), seconds=round(seconds, 4),
                 pinned=len(self.pool))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(consumer, partitions, kind="revoked")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(consumer, partitions, kind="lost")

    def _release(self, consumer: Consumer, partitions: list[TopicPartition], kind: str) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self.metrics.rebalances.labels(kind=kind).inc()
        try:
            self._collect_commits(wait=True, keys=set(keys), settle=True)
            if self.pool.shared is not None and kind == "revoked" and not self._dirty:
                owned = [self.pool.get(key) for key in keys]
                self._commit_delivered([t for t in owned if t and t.txn], self.pool.shared)
            if kind == "revoked" and not self._dirty:
                group_metadata = consumer.consumer_group_metadata()
                self.pool.close(keys, lambda t: self._finish(t, group_metadata, "revoked"))
            else:
                self.pool.close(keys, lambda t: self._finish(t, None, kind))
        except BaseException as exc:
            self._record(exc, "rebalance")
        for topic, partition in keys:
            self._forget_gauges(topic, partition)
        self._report_partitions()
        log.info(f"partitions.{kind}", partitions=_names(keys), pinned=len(self.pool))

    def _finish(self, task: PartitionTask, group_metadata: object | None, reason: str) -> None:
        """Revoked: commit a healthy transaction. Lost, dirty or failed: abort. (Pool thread.)

        A transaction whose commit timed out is left alone: it may have committed,
        and the next owner's init_transactions completes or aborts it correctly."""
        if task.txn is None or task.fenced_at is not None or task.commit_uncertain:
            return
        if group_metadata is not None:
            outcome = self.pool.commit([task], group_metadata)[0]
            if outcome.error is None:
                self._after_commit(outcome)
                return
            log.warning("transaction.commit_failed", topic=task.topic, partition=task.partition,
                        transactional_id=task.transactional_id, error=str(outcome.error))
        try:
            first = task.abort()
        except FencedError as exc:
            self.metrics.producers_fenced.inc()
            self.metrics.aborted.labels(reason="fenced").inc()
            log.warning("producer.fenced", topic=task.topic, partition=task.partition,
                        transactional_id=task.transactional_id, error=str(exc))
            return
        except KafkaOperationError as exc:  # closing anyway: the next owner aborts it
            log.warning("transaction.abort_failed", transactional_id=task.transactional_id,
                        error=str(exc))
            return
        self.metrics.aborted.labels(reason=reason).inc()
        log.info("transaction.aborted", topic=task.topic, partition=task.partition,
                 transactional_id=task.transactional_id, reason=reason, rewind_to=first)

    def _report_partitions(self) -> None:
        """Readiness: a partition whose producer was fenced is assigned, not ready."""
        ready = sum(1 for task in self.pool if task.fenced_at is None)
        self.health.partitions(len(self.pool), ready)

    def _forget_gauges(self, topic: str, partition: int) -> None:
        with contextlib.suppress(KeyError):
            self.metrics.consumer_lag.remove(topic, str(partition))

    # --- errors recorded by librdkafka callbacks ---------------------------------

    def _on_client_error(self, error: KafkaError) -> None:
        """error_cb, on a librdkafka thread: log, and record a fatal error. Never raises."""
        log.warning("kafka.client_error", code=error.name(), error=error.str(),
                    fatal=error.fatal())
        if error.fatal():
            self._recorded.append(FatalError(Where("consumer"), error))

    def _on_consume_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise FatalError(Where("consume"), error)
        log.warning("kafka.consume_error", code=error.name(), error=error.str())

    def _record(self, exc: BaseException, where: str) -> None:
        """Keep an error from a callback for the loop thread to raise."""
        log.error("callback.failed", where=where, error=str(exc), error_class=type(exc).__name__)
        self._recorded.append(exc)

    def _raise_recorded(self) -> None:
        if self._recorded:
            raise self._recorded[0]

    # --- shutdown ----------------------------------------------------------------

    def _close_clean(self) -> None:
        """SIGTERM: commit what is open, leave the group (revokes), close producers."""
        log.info("stage.stopping", open_transactions=sum(1 for t in self.pool if t.txn))
        self._collect_commits(wait=True)
        self._commit_due(float("inf"))
        self._collect_commits(wait=True, settle=True)
        self.consumer.close()
        self.pool.close([t.key for t in self.pool], lambda t: self._finish(t, None, "shutdown"))
        self.pool.shutdown()
        self.health.joined(False)
        log.info("stage.stopped")

    def _close_dirty(self) -> None:
        """After an unexpected error a transaction may hold part of a record's
        outputs: abort everything, commit nothing."""
        self._dirty = True
        log.error("stage.failing", open_transactions=sum(1 for t in self.pool if t.txn))
        self._collect_commits(wait=True, settle=True)  # a commit in flight cannot be recalled
        self.pool.close([t.key for t in self.pool], lambda t: self._finish(t, None, "shutdown"))
        try:
            self.consumer.close()
        except Exception as exc:
            log.warning("consumer.close_failed", error=str(exc))
        self.pool.shutdown()


# Broker answers that refuse a record itself: retrying the same outputs cannot help.
_REFUSALS = frozenset({
    KafkaError.INVALID_RECORD, KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_TIMESTAMP, KafkaError.POLICY_VIOLATION,
})


def _refusal(cause: BaseException) -> bool:
    return isinstance(cause, KafkaOperationError) and cause.code in _REFUSALS


def _names(keys: list[TopicPartitionKey]) -> list[str]:
    return [f"{topic}/{partition}" for topic, partition in keys]
