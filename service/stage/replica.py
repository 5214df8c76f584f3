"""One replica: a consumer, a guarantee, the loop and the listener, wired."""

from __future__ import annotations

import functools
import threading
import time

import structlog
from confluent_kafka import Consumer, KafkaError, TopicPartition

from service.contract.records import Transform
from service.errors import FatalError, Where
from service.exit_codes import ExitCode
from service.kafka.cluster import OutputLimits
from service.kafka.config import admin_config, consumer_config, producer_config
from service.kafka.errors import translated
from service.observability.health import Health
from service.observability.logs import error_cb, librdkafka_logger
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage.guarantees.choice import for_settings
from service.stage.loop import Loop
from service.stage.machine import Policy
from service.stage.overruns import OverrunBook
from service.stage.rebalance import RebalanceListener
from service.stage.shutdown import Watchdog
from service.stage.transform_watch import TransformWatch, overran
from service.stage.transform_watch import timeout_ms as transform_timeout_ms
from service.stage.workers import WorkerPool

log = structlog.get_logger(__name__)
_LOG_CLIENT_ERROR = error_cb("consumer")


_MAX_ABORT_STREAK = 10  # a failed delivery often costs two aborts (failure, epoch bump)
# The loop returns to consume() at least this often (but for one record's transform), so
# a rebalance, an offset commit and a delivery report wait no longer than this; and at
# most a tenth of max.poll.interval.ms, so that a replica never leaves the group for it.
_POLL_GAP_S = 1.0


def poll_gap_s(max_poll_interval_s: float) -> float:
    return min(_POLL_GAP_S, max_poll_interval_s / 10)


class Stage:
    """One replica: a consumer, a committer, the loop and the listener, wired."""

    def __init__(self, settings: Settings, transform: Transform, metrics: Metrics,
                 health: Health, limits: OutputLimits, *, session_timeout_s: float,
                 pool: WorkerPool | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.health = health
        self.stopping = False
        self._deadline: float | None = None
        self._leaving = threading.Lock()
        self.consumer = Consumer({**consumer_config(settings), "error_cb": self._on_client_error,
                                  "on_commit": self._on_commit,
                                  "logger": librdkafka_logger("consumer")})
        # The producers take what the outputs are checked against (OutputLimits).
        committer, traits = for_settings(settings, metrics, self._commit_offsets,
                                         message_max_bytes=limits.producer_max_bytes)
        max_poll_interval_s = float(consumer_config(settings)["max.poll.interval.ms"]) / 1000
        metrics.max_poll_interval.set(max_poll_interval_s)
        self._offsets_committed = traits.offsets_committed  # at-least-once only
        self.committer = committer
        policy = Policy(
            commit_interval_s=settings.commit_interval_ms / 1000,
            commit_max_records=settings.commit_max_records,
            max_abort_streak=_MAX_ABORT_STREAK,
            retry_backoff_s=settings.retry_backoff_ms / 1000,
            max_record_attempts=settings.max_record_attempts,
            reclaim_after_s=session_timeout_s,
            transaction_timeout_s=settings.transaction_timeout_ms / 1000,
            # Past the deadline every Kafka call of a commit or an abort is given
            # (Settings.call_deadline_s), with a margin.
            stuck_after_s=settings.call_deadline_s + 10,
            held_partition_max_bytes=settings.held_partition_max_bytes,
            held_max_bytes=settings.held_max_bytes,
            poll_gap_s=poll_gap_s(max_poll_interval_s),
            renew_after_abort=traits.renew_after_abort,
            commits_deferred=traits.commits_deferred,
        )
        self.loop = Loop(settings, transform, metrics, health, limits, self.consumer, committer,
                         policy, pool)
        if pool is not None:
            health.workers_alive = lambda: pool.alive
        # A revoke waits this long for commits in flight (the group waits with it).
        self.listener = RebalanceListener(self.loop, metrics, health,
                                          release_s=min(settings.shutdown_timeout_s, 10.0))
        self.watchdog = Watchdog(self._leave_group)
        self.transform_watch = self._watch_transform(settings)

    def _watch_transform(self, settings: Settings) -> TransformWatch | None:
        """TXSTAGE_TRANSFORM_TIMEOUT_MS: a call past it is recorded for the next owner
        and the replica leaves (stage/transform_watch.py)."""
        timeout = transform_timeout_ms(settings)
        if not timeout or settings.workers:  # workers: the pool kills the worker instead
            return None
        book = OverrunBook(settings.id_prefix, admin_config(settings),
                           producer_config(settings, None))
        self.loop.overruns = book
        exit_code = ExitCode.TRANSFORM_TIMED_OUT
        on_overrun = functools.partial(
            overran, book=book, timeout=timeout, metrics=self.metrics, health=self.health,
            leave_and_exit=lambda: self.watchdog.leave_and_exit(exit_code))
        return TransformWatch(self.loop.watch, timeout / 1000, on_overrun)

    def run(self) -> None:
        """Process until ``stop()``; then commit what is open and leave the group."""
        self.consumer.subscribe(list(self.settings.input_topics),
                                on_assign=self.listener.on_assign,
                                on_revoke=self.listener.on_revoke,
                                on_lost=self.listener.on_lost)
        log.info("stage.started", topics=list(self.settings.input_topics),
                 guarantee=self.settings.guarantee, group_id=self.settings.group_id,
                 group_protocol=self.settings.group_protocol)
        if self.transform_watch is not None:
            self.transform_watch.start()
        try:
            while not self.stopping:
                self.loop.iterate()
        except BaseException:
            self._close(dirty=True)
            raise
        self._close(dirty=False)

    def stop(self) -> None:
        """Ask the loop to finish after the record being transformed (signal-handler
        safe); the shutdown budget starts now."""
        if not self.stopping:
            self.stopping = True
            self.loop.interrupt()
            self._deadline = time.monotonic() + self.settings.shutdown_timeout_s
            self.watchdog.arm(self.settings.shutdown_timeout_s, exit_code=0)

    def _close(self, *, dirty: bool) -> None:
        """Within the budget: let work in flight end, commit what is healthy (dirty:
        abort everything, commit nothing), close the producers, leave the group."""
        budget = self.settings.shutdown_timeout_s
        deadline = self._deadline or time.monotonic() + budget
        self.watchdog.arm(deadline - time.monotonic(), exit_code=1 if dirty else 0)
        loop = self.loop
        open_transactions = sum(1 for p in loop.partitions.values() if p.state.txn)
        if dirty:
            log.error("stage.failing", open_transactions=open_transactions)
        else:
            log.info("stage.stopping", open_transactions=open_transactions)
        try:
            keys = list(loop.partitions)
            tps = [TopicPartition(topic, partition) for topic, partition in keys]
            self.listener.release(tps, lost=dirty, reason="shutdown", deadline=deadline)
        finally:
            self._leave_group()
            self.committer.shutdown(max(deadline - time.monotonic(), 0.0))
            loop.jobs.shutdown()
            if loop.pool is not None:
                loop.pool.shutdown()
            self.health.joined(False)
            self.watchdog.disarm()
            if self.transform_watch is not None:
                self.transform_watch.stop()
        log.info("stage.stopped")

    def _leave_group(self) -> None:
        with self._leaving:
            if self.watchdog.left.is_set():
                return
            self.watchdog.left.set()
            self.listener.abandoning = True  # everything was released already (or given up)
            try:
                self.consumer.close()
            except Exception as exc:
                log.warning("consumer.close_failed", error=str(exc))

    def _commit_offsets(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        if asynchronous:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        else:
            with translated(Where("commit")):
                self.consumer.commit(offsets=offsets, asynchronous=False)

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Result of an at-least-once offset commit, served by the consumer's poll on
        the loop thread; never raises. A failed commit loses nothing: the committer
        sends it again (or a newer one), or the next owner processes those records
        again."""
        failed = [tp for tp in partitions if tp.error is not None]
        first = error or (failed[0].error if failed else None)
        if first is not None:
            self.metrics.kafka_errors.labels(op="commit_offsets", action="retry").inc()
            log.warning("offsets.commit_failed", code=first.name(), error=first.str(),
                        partitions=[f"{tp.topic}[{tp.partition}]@{tp.offset}"
                                    for tp in (partitions if error else failed)])
        if self._offsets_committed is not None and self._offsets_committed(error, partitions):
            self.loop.reporter.offsets_committed()

    def _on_client_error(self, error: KafkaError) -> None:
        """error_cb, on a librdkafka thread: log (folded, as every client's), and record a
        fatal error. Never raises."""
        _LOG_CLIENT_ERROR(error)
        if error.fatal():
            self.loop.recorded.append(FatalError(Where("consumer"), error))
