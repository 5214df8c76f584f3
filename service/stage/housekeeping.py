"""Once a second: readiness, stalled and stuck partitions, partitions librdkafka
left unfetched, the transaction budget, and the gauges read between scrapes. The
:class:`Housekeeper` decides; what it finds is handed back for the loop to carry
out (events to dispatch, fetchers to restart, a new commit interval)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import cast

import structlog
from confluent_kafka import (
    Consumer,
    TopicPartition,
)

from service.kafka.cluster import OutputLimits
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage import machine as sm
from service.stage.budget import BUSY_FOR_S, budgeted_interval
from service.stage.fetch_watch import FetchWatch
from service.stage.jobs import Jobs
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.reports import Reporter
from service.stage.workers import WorkerPool

log = structlog.get_logger(__name__)

_HOUSEKEEPING_EVERY_S = 1.0
_STABLE_READ_S = 5.0


@dataclass
class Chores:
    """What a round of housekeeping found for the loop to carry out."""

    events: list[tuple[Partition, sm.Event]] = field(default_factory=list)
    restarts: list[Partition] = field(default_factory=list)  # fetchers to restart
    interval_s: float | None = None  # the commit interval the budget sets now


class Housekeeper:
    """The once-a-second watch over the loop's partitions (``partitions``: the
    loop's, read only)."""

    def __init__(self, settings: Settings, metrics: Metrics, consumer: Consumer, jobs: Jobs,
                 partitions: Mapping[TopicPartitionKey, Partition], reporter: Reporter,
                 fetch_watch: FetchWatch, transaction_timeout_s: float) -> None:
        self._settings = settings
        self._metrics = metrics
        self._consumer = consumer
        self._jobs = jobs
        self._partitions = partitions
        self._reporter = reporter
        self._fetch_watch = fetch_watch
        self.due_at = 0.0  # the next round
        self._assigning_since: float | None = None
        self._fetch_check: tuple[dict[TopicPartitionKey, int], Future[object]] | None = None
        self._workers_counted = (0, 0, 0.0)  # restarts, time-outs, busy seconds reported
        self.describe_requested = False  # set by SIGUSR1: log every partition's state
        # A waiting phase lasting longer than a transaction could is worth a warning.
        self._stalled_after_s = max(transaction_timeout_s, 30.0) + 30.0

    def assigning(self, now: float) -> None:
        """Partitions were assigned: the rebalance lasts until all are ready."""
        self._assigning_since = self._assigning_since or now

    def run(self, now: float, policy: sm.Policy, held_bytes: int, pool: WorkerPool | None,
            limits: OutputLimits) -> Chores:
        chores = Chores()
        partitions = self._partitions
        if self._assigning_since is not None and all(
                p.state.ready for p in partitions.values()):
            self._metrics.rebalance_seconds.observe(now - self._assigning_since)
            self._assigning_since = None
            self._reporter.partitions()
        if now < self.due_at:
            return chores
        self.due_at = now + _HOUSEKEEPING_EVERY_S
        metrics = self._metrics
        self._reporter.partitions()
        self._watch_stalls(now, policy, chores)
        if self._fetch_watch.stall_after_s:
            self._watch_fetching(now, limits, chores)
        metrics.oldest_open_transaction.set(
            max((p.state.age(now) for p in partitions.values()), default=0))
        chores.interval_s = self._keep_to_budget(now, policy)
        metrics.held_records.set(sum(len(p.held) for p in partitions.values()))
        metrics.held_bytes.set(held_bytes)
        if pool is not None:
            self._report_workers(pool)
        for partition in partitions.values():
            high = self._fetched_high(partition.tp)
            if high >= 0 and partition.position >= 0:
                metrics.consumer_lag.labels(partition.topic, str(partition.partition)).set(
                    max(high - partition.read_to(), 0))
        return chores

    def _keep_to_budget(self, now: float, policy: sm.Policy) -> float | None:
        """TXSTAGE_MAX_TRANSACTIONS_PER_S: the commit interval for the partitions busy
        now (stage/budget.py), applied from the next due time on; None: unchanged."""
        if not self._settings.max_transactions_per_s and not policy.stretched_interval_s:
            return None  # no budget (the default): nothing to count
        busy = sum(1 for p in self._partitions.values()
                   if p.state.txn is not None or now - p.committed_at < BUSY_FOR_S)
        if self._settings.spanning:  # one transaction for them all
            busy = min(busy, 1)
        interval = budgeted_interval(policy.commit_interval_s, busy,
                                     self._settings.max_transactions_per_s,
                                     policy.transaction_timeout_s / 10)
        if interval == policy.interval_s:
            return None
        self._metrics.commit_interval.set(interval)
        return interval

    def _report_workers(self, pool: WorkerPool) -> None:
        metrics = self._metrics
        metrics.workers_alive.set(pool.alive)
        metrics.worker_chunks_in_flight.set(pool.in_flight)
        counted = self._workers_counted
        now = (pool.restarts, pool.timeouts, pool.busy_seconds())
        metrics.worker_restarts.inc(now[0] - counted[0])
        metrics.transform_timeouts.inc(now[1] - counted[1])
        metrics.worker_busy_seconds.inc(max(now[2] - counted[2], 0.0))
        self._workers_counted = now

    def _watch_stalls(self, now: float, policy: sm.Policy, chores: Chores) -> None:
        """Log each partition on request (SIGUSR1), and warn once per phase about a
        partition that has waited in a phase longer than any transaction may last;
        a commit or an abort stuck past its deadline is the state machine's to judge
        (CallStuck)."""
        if self.describe_requested:
            self.describe_requested = False
            log.info("stage.partitions", jobs_running=self._jobs.running,
                     partitions=[p.describe(now) for p in self._partitions.values()])
        for partition in list(self._partitions.values()):
            phase = partition.state.phase
            if phase in (sm.Phase.COMMITTING, sm.Phase.ABORTING) and partition.job is not None \
                    and now - partition.phase_since > policy.stuck_after_s:
                chores.events.append((partition, sm.CallStuck(now)))
                continue
            if partition.stalled_warned or (phase is sm.Phase.ACTIVE
                                            and not partition.seek.landing):
                continue  # (ACTIVE waiting for its seek to land is waiting too)
            if now - partition.phase_since > self._stalled_after_s:
                partition.stalled_warned = True
                log.warning("partition.stalled", **partition.describe(now))

    def _watch_fetching(self, now: float, limits: OutputLimits, chores: Chores) -> None:
        """Find the partitions librdkafka left unfetched, to restart their fetchers:
        see fetch_watch.py. Kafka is asked beside the loop, one question at a time."""
        watch = self._fetch_watch
        if self._fetch_check is not None:
            asked, future = self._fetch_check
            if not future.done():
                return
            self._fetch_check = None
            high = cast("dict[TopicPartitionKey, int]", future.result() or {})
            fetched = {key: self._fetched_high(TopicPartition(*key)) for key in asked}
            for key in watch.stalled(asked, high, fetched, now):
                partition = self._partitions.get(key)
                if partition is not None and should_fetch(partition):
                    log.warning("partition.fetch_stalled", topic=partition.topic,
                                partition=partition.partition, position=partition.position,
                                high_watermark=high.get(key, -1),
                                fetched_high_watermark=fetched[key],
                                note="no fetch response for the partition although Kafka "
                                     "holds offsets past what librdkafka last saw: its "
                                     "fetcher is restarted (pause, resume, seek)")
                    self._metrics.fetch_stalls.inc()
                    chores.restarts.append(partition)
        idle = watch.idle(((p.key, p.position, should_fetch(p))
                           for p in self._partitions.values()), now)
        if idle:
            cluster, keys = limits.cluster, list(idle)
            self._fetch_check = (idle, self._jobs.spawn(
                lambda: cluster.high_watermarks(keys, timeout_s=_STABLE_READ_S)))

    def _fetched_high(self, tp: TopicPartition) -> int:
        """The high watermark of the partition's last fetch response (-1: none)."""
        _, high = self._consumer.get_watermark_offsets(tp, cached=True)
        return high if high is not None and high >= 0 else -1


def should_fetch(partition: Partition) -> bool:
    """Nothing but librdkafka stands between the partition and its next record:
    ACTIVE, no pause, no seek pending, nothing held or running."""
    state = partition.state
    return state.phase is sm.Phase.ACTIVE and not state.pauses \
        and not partition.seek.landing and not partition.releasing \
        and not partition.held and partition.job is None
