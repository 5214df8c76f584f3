"""Every Prometheus metric txstage exports, in one place (documented in docs/metrics.md).

Labels stay bounded: ``reason``/``kind``/``op`` are fixed sets, ``topic`` is an
output topic, and per-partition gauges exist only for partitions this replica
owns right now.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

import confluent_kafka
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from service.observability.txn_states import TransactionStates
from service.version import __version__

# 1 ms .. 10 s: resolves both a healthy sub-10 ms commit and a stalled coordinator,
# and is finer (x1.5 or so) between 50 ms and 1 s, where commits of a busy stage
# land and a p99 ÷ p50 of 2 must not read as a bucket bound's 5.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0,
)
SIZE_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
# End to end: a commit interval and a commit make the floor; a backlog reaches minutes.
END_TO_END_BUCKETS = (
    0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)

ABORT_REASONS = (
    "abortable_error",  # librdkafka said txn_requires_abort (e.g. a failed delivery)
    "fenced",           # another owner took the transactional.id
    "revoked",          # partition revoked while its transaction was unhealthy
    "lost",             # partition lost (max.poll.interval exceeded, session expired)
    "shutdown",         # shutting down with an unhealthy transaction
    "poison",           # transform failed and no dead-letter topic is configured
    "timed_out",        # the coordinator aborted it (transaction.timeout.ms passed)
    "spanning",         # TXSTAGE_TRANSACTIONS=spanning: aborted with another partition
)
REBALANCE_KINDS = ("assigned", "revoked", "lost")
LIBRDKAFKA_TRANSACTION_TIMEOUT_S = 60.0  # librdkafka default transaction.timeout.ms


class HotHistogram:
    """A histogram for the per-record hot path, exported like a prometheus_client
    Histogram (``_bucket``, ``_count``, ``_sum``). ``observe`` is a bisect and two
    additions (prometheus_client's takes a lock and several calls: ~3 µs a record).
    Only the loop thread observes; a scrape reads counters under the GIL."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self._name, self._documentation = name, documentation
        self._bounds = list(buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        registry.register(self)

    @property
    def name(self) -> str:
        return self._name

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation)
        counts, total, buckets = list(self._counts), self._sum, []
        cumulative = 0
        for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
        family.add_metric([], buckets, total)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._documentation)


class Metrics:
    """The metric objects of one process, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # The standard families of any Python exporter: process_* (CPU seconds, memory,
        # file descriptors), python_gc_* (collections per generation) and python_info.
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)
        PlatformCollector(registry=registry)
        self.info = Info("txstage_build", "Build and mode of this replica", registry=registry)
        self.commit_seconds = Histogram(
            "txstage_transaction_commit_seconds",
            "Commit latency of one transaction: send_offsets_to_transaction + commit_transaction",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.end_to_end_seconds = Histogram(
            "txstage_end_to_end_seconds",
            "Exactly-once: input record timestamp to its transaction's commit (outputs "
            "visible to read_committed readers), for the first and the last input record "
            "of each committed transaction",
            ["record"], buckets=END_TO_END_BUCKETS, registry=registry,
        )
        self.committed = Counter(
            "txstage_transactions_committed",
            "Transactions committed", registry=registry,
        )
        self.aborted = Counter(
            "txstage_transactions_aborted",
            "Transactions aborted, by reason", ["reason"], registry=registry,
        )
        self.records_per_transaction = Histogram(
            "txstage_records_per_transaction",
            "Input records per committed transaction", buckets=SIZE_BUCKETS, registry=registry,
        )
        self.consumed = Counter(
            "txstage_records_consumed", "Input records consumed", registry=registry,
        )
        self.produced = Counter(
            "txstage_records_produced",
            "Output records produced (in committed or open transactions), by output topic",
            ["topic"], registry=registry,
        )
        self.dead_lettered = Counter(
            "txstage_records_dead_lettered",
            "Input records written to the dead-letter topic", registry=registry,
        )
        self.transform_seconds = HotHistogram(
            "txstage_transform_seconds", "Time the transform took per input record",
            LATENCY_BUCKETS, registry)
        self.pinned_producers = Gauge(
            "txstage_pinned_producers",
            "Transactional producers currently pinned to assigned partitions", registry=registry,
        )
        self.producer_init_seconds = Histogram(
            "txstage_producer_init_seconds",
            "Time to create a pinned producer and run init_transactions",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.producers_fenced = Counter(
            "txstage_producers_fenced",
            "Pinned producers fenced by a newer owner of their transactional.id",
            registry=registry,
        )
        self.schema_registry_up = Gauge(
            "txstage_schema_registry_up",
            "1 while the schema registry answers (or none is used), 0 while partitions wait "
            "for it", registry=registry)
        self.schema_registry_up.set(1)
        self.fetch_stalls = Counter(
            "txstage_fetch_stalls",
            "Partitions found unfetched though Kafka held committed records past their "
            "position; each one's fetcher was restarted", registry=registry,
        )
        self.transform_timeouts = Counter(
            "txstage_transform_timeouts",
            "Transform calls that ran past TXSTAGE_TRANSFORM_TIMEOUT_MS (in-process the "
            "replica then exits; with workers the worker is killed)", registry=registry,
        )
        self.workers_alive = Gauge(
            "txstage_workers_alive",
            "Transform worker processes alive (TXSTAGE_WORKERS; absent in-process)",
            registry=registry,
        )
        self.worker_chunks_in_flight = Gauge(
            "txstage_worker_chunks_in_flight",
            "Chunks of records sent to the workers whose results are not processed yet",
            registry=registry,
        )
        self.worker_restarts = Counter(
            "txstage_worker_restarts",
            "Transform worker processes replaced (died, or killed past the time-out)",
            registry=registry,
        )
        self.worker_busy_seconds = Counter(
            "txstage_worker_busy_seconds",
            "Seconds the transform workers spent on chunks, summed over workers (its rate "
            "divided by TXSTAGE_WORKERS is their busy ratio)", registry=registry,
        )
        self.rebalances = Counter(
            "txstage_rebalances",
            "Rebalance callbacks, by kind", ["kind"], registry=registry,
        )
        self.rebalance_seconds = Histogram(
            "txstage_rebalance_seconds",
            "From an assignment callback to every new partition's producer ready",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.kafka_errors = Counter(
            "txstage_kafka_errors",
            "Kafka call failures, by operation and the action taken", ["op", "action"],
            registry=registry,
        )
        self.consumer_lag = Gauge(
            "txstage_consumer_lag",
            "Records between the consumer position and the partition's high watermark",
            ["topic", "partition"], registry=registry,
        )
        # service/observability/group_lag.py: every replica exports every partition.
        self.group_lag = Gauge(
            "txstage_group_lag",
            "Records between the group's committed offset and the partition's high "
            "watermark, for every input partition, owned or not",
            ["topic", "partition"], registry=registry,
        )
        self.oldest_open_transaction = Gauge(
            "txstage_oldest_open_transaction_seconds",
            "Age of the oldest transaction open on this replica (0 when none)",
            registry=registry,
        )
        self.last_commit = Gauge(
            "txstage_last_commit_timestamp_seconds",
            "Unix time of the last committed transaction", registry=registry,
        )
        self.ready = Gauge(
            "txstage_ready",
            "1 when this replica passes its readiness check (/readyz), else 0",
            registry=registry,
        )
        self.transaction_timeout = Gauge(
            "txstage_transaction_timeout_seconds",
            "The producers' transaction.timeout.ms, in seconds: the limit for open transactions",
            registry=registry,
        )
        # service/observability/lso_watch.py: an open (or hanging) transaction holds the LSO back.
        self.lso_lag = Gauge(
            "txstage_lso_lag_records",
            "High watermark minus last stable offset, per input and output partition",
            ["role", "topic", "partition"], registry=registry,
        )
        self.lso_stuck = Gauge(
            "txstage_lso_stuck_seconds",
            "How long the last stable offset has stayed below the high watermark without "
            "moving (an open transaction that long), per input and output partition",
            ["role", "topic", "partition"], registry=registry,
        )
        self.commit_interval = Gauge(
            "txstage_commit_interval_seconds",
            "The commit interval in force: TXSTAGE_COMMIT_INTERVAL_MS, stretched while more "
            "partitions are busy than TXSTAGE_MAX_TRANSACTIONS_PER_S allows", registry=registry,
        )
        self.held_records = Gauge(
            "txstage_held_records",
            "Input records consumed and not processed yet (a partition committing, or a "
            "batch handed back at the poll-gap bound), on this replica", registry=registry,
        )
        self.held_bytes = Gauge(
            "txstage_held_bytes",
            "Bytes (key, value, headers) of the held input records, on this replica",
            registry=registry,
        )
        self.poll_gap_yields = Counter(
            "txstage_poll_gap_yields",
            "Batches ended at the poll-gap bound, their rest held for the next iterations",
            registry=registry,
        )
        self.seconds_since_poll = Gauge(
            "txstage_seconds_since_poll",
            "Seconds since the consumer loop last returned from consume(), read at scrape "
            "time (a replica past max.poll.interval.ms leaves the group)", registry=registry,
        )
        self.max_poll_interval = Gauge(
            "txstage_max_poll_interval_seconds",
            "The consumer's max.poll.interval.ms, in seconds", registry=registry,
        )
        self.transaction_states = TransactionStates()  # service/observability/txn_states.py
        registry.register(self.transaction_states)
        # librdkafka's default until the stage reports its configured value, so the
        # "oldest open transaction" alert compares against something real from the start.
        self.transaction_timeout.set(LIBRDKAFKA_TRANSACTION_TIMEOUT_S)
        for reason in ABORT_REASONS:
            self.aborted.labels(reason=reason)
        for kind in REBALANCE_KINDS:
            self.rebalances.labels(kind=kind)
        for record in ("first", "last"):
            self.end_to_end_seconds.labels(record=record)

    # What a commit, an abort and a fence count, wherever the stage learns of one (a
    # state-machine report, a release's own commit, an at-least-once offset commit).

    def count_commit(self, seconds: float | None = None, records: int | None = None) -> None:
        """A commit Kafka confirmed: ``seconds`` it took, ``records`` of input it held
        (either unknown: not observed)."""
        if seconds is not None:
            self.commit_seconds.observe(seconds)
        if records is not None:
            self.records_per_transaction.observe(records)
        self.committed.inc()
        self.last_commit.set_to_current_time()

    def count_abort(self, reason: str) -> None:
        self.aborted.labels(reason=reason).inc()

    def count_fence(self, *, open_transaction: bool, timed_out: bool = False) -> None:
        """A fenced producer; the transaction it had open (if any) was aborted by the
        coordinator: ``timed_out`` (it ran past transaction.timeout.ms) or by a newer
        owner's init_transactions."""
        self.producers_fenced.inc()
        if open_transaction:
            self.count_abort("timed_out" if timed_out else "fenced")

    def describe_build(self, guarantee: str, group_id: str) -> None:
        self.info.info({"version": __version__, "guarantee": guarantee, "group_id": group_id,
                        "librdkafka": confluent_kafka.libversion()[0]})
