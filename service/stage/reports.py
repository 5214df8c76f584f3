"""The state machine's reports, and what the release path's jobs found, turned into
log lines and metrics. The :class:`Reporter` is the one caller of ``Metrics.count_*``:
a commit, an abort and a fence count here, wherever the stage learns of one."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import structlog

from service.contract.records import Record
from service.errors import (
    FencedError,
    KafkaOperationError,
)
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.stage import machine as sm
from service.stage.guarantees.guarantee import ReleaseReport
from service.stage.partition import Partition, TopicPartitionKey

log = structlog.get_logger(__name__)

# A transaction still open after this share of transaction.timeout.ms is warned about.
_NEAR_TIMEOUT = 0.5


class Reporter:
    """Reports to log lines and metrics. ``partitions``: the loop's own (read for
    readiness only); ``transactional_id``: a partition's, for the log lines."""

    def __init__(self, metrics: Metrics, health: Health,
                 partitions: Mapping[TopicPartitionKey, Partition],
                 transactional_id: Callable[[TopicPartitionKey], str | None]) -> None:
        self.metrics = metrics
        self.health = health
        self._partitions = partitions
        self._transactional_id = transactional_id
        self._warned_near_timeout = False

    def report(self, partition: Partition, action: sm.Action, policy: sm.Policy) -> None:
        """A report action of the state machine."""
        where = {"topic": partition.topic, "partition": partition.partition,
                 "transactional_id": self._transactional_id(partition.key)}
        match action:
            case sm.Committed(txn, seconds):
                partition.committed_at = time.monotonic()
                if seconds >= 0:
                    self._end_to_end(txn)
                    self.metrics.count_commit(seconds, txn.records)
                else:  # at-least-once sealed a window: its offsets commit later, counted then
                    self.metrics.records_per_transaction.observe(txn.records)
                # The commit trail (debug: one line per transaction) for tracing a
                # partition's committed offsets after the fact, as a soak needs.
                log.debug("transaction.committed", **where, first_offset=txn.first,
                          next_offset=txn.next, records=txn.records)
            case sm.Aborted("poison", _, attempt, cause):
                self.metrics.count_abort("poison")
                log.error("record.poison", **where, attempt=attempt,
                          max_attempts=policy.max_record_attempts, error=cause)
            case sm.Aborted(reason, txn, streak, cause):
                self.metrics.count_abort(reason)
                log.warning("transaction.aborted", **where, reason=reason, streak=streak,
                            first_offset=txn.first if txn else None,
                            last_offset=txn.last if txn else None, error=cause)
            case sm.Fenced(txn, timed_out, cause):
                self.metrics.count_fence(open_transaction=txn is not None, timed_out=timed_out)
                log.warning("producer.fenced", **where, timed_out=timed_out, error=cause)
                self.partitions()
            case sm.Isolating(first, until):
                log.warning("partition.isolating", **where, offsets=f"{first}..{until - 1}")
            case sm.RecordRefused(offset, cause):
                log.warning("record.output_refused", **where, offset=offset, error=cause)
            case sm.Reclaiming():
                log.info("producer.reclaimed", **where)
            case _:
                raise TypeError(f"no executor for {action!r}")

    def kafka_error(self, error: KafkaOperationError) -> None:
        self.metrics.kafka_errors.labels(op=error.where.op, action=error.action).inc()

    def abandoned(self, partition: Partition, event: object) -> None:
        """The end of a job whose partition was given up while it ran (lost while
        committing, say): nothing is left to decide, but a fence it found is reported as
        any other is. (A paused replica that resumes often starts the commits that fell
        due meanwhile before it hears its partitions are lost; they meet its successor's
        fence, which the operator must see.) A release's own commit or abort reports
        what it found (``ReleaseReport``)."""
        if isinstance(event, ReleaseReport):
            self.released(event)
            return
        error = getattr(event, "error", None)
        if isinstance(error, FencedError):
            self.metrics.count_fence(open_transaction=isinstance(event, sm.CommitFailed))
            log.warning("producer.fenced", topic=partition.topic, partition=partition.partition,
                        transactional_id=self._transactional_id(partition.key),
                        on="abandoned", error=str(error))

    def released(self, report: ReleaseReport) -> None:
        """What a release's own commit or abort found (its job logged it)."""
        if report.fenced is not None:
            self.metrics.count_fence(open_transaction=report.fenced)
        elif report.aborted is not None:
            self.metrics.count_abort(report.aborted)
        elif report.committed_s is not None:
            self.metrics.count_commit(report.committed_s, report.records)

    def offsets_committed(self) -> None:
        """At-least-once: Kafka confirmed an offset commit (the consumer's on_commit)."""
        self.metrics.count_commit()

    def _end_to_end(self, txn: sm.Txn) -> None:
        """A committed transaction's outputs are visible to read_committed readers now:
        how long after its first and its last input record were appended (by their
        timestamps: the producer's clock for CreateTime, the broker's for LogAppendTime)."""
        now_ms = time.time() * 1000
        for label, stamp in (("first", txn.first_ts_ms), ("last", txn.last_ts_ms)):
            if stamp >= 0:
                self.metrics.end_to_end_seconds.labels(record=label).observe(
                    max(now_ms - stamp, 0.0) / 1000)

    def dead_lettered(self, partition: Partition, record: Record, error: BaseException) -> None:
        self.metrics.dead_lettered.inc()
        log.warning("record.dead_lettered", topic=record.topic, partition=record.partition,
                    offset=record.offset,
                    transactional_id=self._transactional_id(partition.key),
                    error_class=type(error).__name__, error=str(error))

    def warn_near_timeout(self, partition: Partition, now: float, policy: sm.Policy) -> None:
        """A transaction that starts its commit with half its time-out gone means a
        record's transform takes nearly as long as a transaction may: said once."""
        txn = partition.state.txn
        timeout_s = policy.transaction_timeout_s
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

    def partitions(self) -> None:
        """Readiness: a partition is ready once it processes records."""
        partitions = self._partitions
        ready = sum(1 for p in partitions.values() if p.state.ready)
        self.health.partitions(len(partitions), ready)
