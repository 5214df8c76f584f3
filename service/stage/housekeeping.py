"""Once a second: readiness, stalled and stuck partitions, partitions librdkafka
left unfetched."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import structlog
from confluent_kafka import (
    TopicPartition,
)

from service.stage import machine as sm
from service.stage.budget import BUSY_FOR_S, budgeted_interval
from service.stage.loop_state import LoopState
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.workers import WorkerPool

log = structlog.get_logger(__name__)

_HOUSEKEEPING_EVERY_S = 1.0
_STABLE_READ_S = 5.0


class Housekeeping(LoopState):
    """The once-a-second watch of :class:`Loop` over its partitions."""

    def _housekeeping(self, now: float) -> None:
        if self._assigning_since is not None and all(
                p.state.ready for p in self.partitions.values()):
            self.metrics.rebalance_seconds.observe(now - self._assigning_since)
            self._assigning_since = None
            self.reporter.partitions()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + _HOUSEKEEPING_EVERY_S
        self.reporter.partitions()
        self._watch_stalls(now)
        if self.fetch_watch.stall_after_s:
            self._watch_fetching(now)
        self.metrics.oldest_open_transaction.set(
            max((p.state.age(now) for p in self.partitions.values()), default=0))
        self._keep_to_budget(now)
        self.metrics.held_records.set(sum(len(p.held) for p in self.partitions.values()))
        self.metrics.held_bytes.set(self.held_bytes)
        if self.pool is not None:
            self._report_workers(self.pool)
        for partition in self.partitions.values():
            high = self._fetched_high(partition.tp)
            if high >= 0 and partition.position >= 0:
                self.metrics.consumer_lag.labels(partition.topic, str(partition.partition)).set(
                    max(high - partition.read_to(), 0))

    def _keep_to_budget(self, now: float) -> None:
        """TXSTAGE_MAX_TRANSACTIONS_PER_S: the commit interval for the partitions busy
        now (stage/budget.py), applied from the next due time on."""
        policy = self.policy
        if not self.settings.max_transactions_per_s and not policy.stretched_interval_s:
            return  # no budget (the default): nothing to count
        busy = sum(1 for p in self.partitions.values()
                   if p.state.txn is not None or now - p.committed_at < BUSY_FOR_S)
        interval = budgeted_interval(policy.commit_interval_s, busy,
                                     self.settings.max_transactions_per_s,
                                     policy.transaction_timeout_s / 10)
        if interval != policy.interval_s:
            self.policy = replace(policy, stretched_interval_s=interval)
            self.metrics.commit_interval.set(interval)

    def _report_workers(self, pool: WorkerPool) -> None:
        metrics = self.metrics
        metrics.workers_alive.set(pool.alive)
        metrics.worker_chunks_in_flight.set(pool.in_flight)
        counted = self._workers_counted
        now = (pool.restarts, pool.timeouts, pool.busy_seconds())
        metrics.worker_restarts.inc(now[0] - counted[0])
        metrics.transform_timeouts.inc(now[1] - counted[1])
        metrics.worker_busy_seconds.inc(max(now[2] - counted[2], 0.0))
        self._workers_counted = now

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
                                            and partition.seek.seek_to is None):
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
            and partition.seek.seek_to is None and not partition.releasing \
            and not partition.held and partition.job is None

    def _restart_fetch(self, partition: Partition, high: int, fetched_high: int) -> None:
        log.warning("partition.fetch_stalled", topic=partition.topic,
                    partition=partition.partition, position=partition.position,
                    high_watermark=high, fetched_high_watermark=fetched_high,
                    note="no fetch response for the partition although Kafka holds offsets "
                         "past what librdkafka last saw: its fetcher is restarted (pause, "
                         "resume, seek)")
        self.metrics.fetch_stalls.inc()
        self.consumer.pause([partition.tp])
        self.consumer.resume([partition.tp])
        self.positions.seek(partition, partition.seek.restart_at(partition.position))
