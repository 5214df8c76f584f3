"""Exactly-once: a transactional producer pinned to each input partition.

``transactional.id = <prefix>.<topic>.<partition>``, so ``init_transactions`` on
assignment fences any older owner and finishes what it left open. One transaction
holds a partition's outputs and that partition's input offsets (transaction.py).
Every call that waits on Kafka runs as a job, beside the loop.
"""

from __future__ import annotations

import threading
import time

import structlog

from service.contract.processing import Processed, Produced
from service.errors import FencedError, KafkaOperationError, RetriableError
from service.kafka import transaction
from service.kafka.config import producer_config
from service.kafka.producer import PinnedProducer, close_quietly
from service.observability.logs import error_cb, librdkafka_logger
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage.guarantees.guarantee import GroupMetadata, Job, ReleaseJob, ReleaseReport
from service.stage.machine import (
    AbortDone,
    AbortFailed,
    CommitDone,
    CommitFailed,
    Event,
    InitDone,
    InitFailed,
    Txn,
)
from service.stage.partition import TopicPartitionKey

log = structlog.get_logger(__name__)


class ExactlyOnce:
    """The pinned producers of the partitions this replica owns.

    A job holds the producer object it was started with, not the partition's key:
    once a partition is released or fenced its producer is *detached* at once (on
    the loop thread), so a new incarnation of the partition (re-assigned, or
    reclaimed) never shares or closes a producer an old job still uses.

    An init job has no producer to detach until init_transactions returns, so each
    init is given a token, the partition's current one until it is detached: a job
    whose token was taken away meanwhile (released while it ran, the partition
    perhaps assigned again and initialised by a newer job) closes its own producer
    and leaves the registry alone. Token and registry change together, under a lock:
    the job ends on its own thread."""

    def __init__(self, settings: Settings, metrics: Metrics, *,
                 message_max_bytes: int | None = None) -> None:
        self._settings = settings
        self._message_max_bytes = message_max_bytes  # producer_config's
        self._metrics = metrics
        self._producers: dict[TopicPartitionKey, PinnedProducer] = {}
        self._initialising: dict[TopicPartitionKey, object] = {}  # the current init's token
        self._lock = threading.Lock()
        self._logger = librdkafka_logger("producer")
        # init_transactions may wait out a dead owner's transaction: allow the
        # whole transaction timeout plus a margin before calling it fatal.
        self._deadline_s = settings.call_deadline_s

    def transactional_id(self, key: TopicPartitionKey) -> str:
        return self._settings.transactional_id(*key)

    def init(self, key: TopicPartitionKey, replacing: bool = False) -> Job:
        """A job: a new pinned producer for ``key``, its transactions initialised.

        A partition's first producer of an assignment asks for metadata before
        init_transactions (PinnedProducer's ``connect_first``): without it, a third of
        new producers wait out librdkafka's 500 ms coordinator timer, and a fail-over
        or a rebalance waits for the slowest. A replacement does not: it follows
        trouble with the cluster, and with a frozen broker the metadata request can
        keep init_transactions from finishing (PinnedProducer.init)."""
        tid = self.transactional_id(key)
        token = object()
        with self._lock:
            self._initialising[key] = token
        # Here, on the loop thread, in order with _detach's forget: the transaction
        # states of a producer whose partition was given up are not kept.
        stats_cb = self._metrics.transaction_states.callback(tid) \
            if self._settings.statistics_interval_ms else None  # observability/txn_states.py

        def job() -> Event | None:
            started = time.monotonic()
            producer = None
            try:
                config = {**producer_config(self._settings, tid,
                                            message_max_bytes=self._message_max_bytes),
                          "logger": self._logger}
                if stats_cb is not None:
                    config.setdefault("statistics.interval.ms",
                                      self._settings.statistics_interval_ms)
                    config["stats_cb"] = stats_cb
                producer = PinnedProducer(config, *key, deadline_s=self._deadline_s,
                                          on_error=error_cb(tid), connect_first=not replacing)
                producer.init()
            except KafkaOperationError as exc:
                log.error("producer.init_failed", transactional_id=tid, error=str(exc))
                with self._lock:
                    if self._initialising.get(key) is token:
                        del self._initialising[key]
                if producer is not None:
                    producer.close()
                return InitFailed(exc, time.monotonic())
            seconds = time.monotonic() - started
            with self._lock:
                current = self._initialising.get(key) is token
                if current:
                    del self._initialising[key]
                    replaced = self._producers.pop(key, None)  # none: detached before
                    self._producers[key] = producer
                    self._metrics.pinned_producers.set(len(self._producers))
            if not current:  # its partition was given up meanwhile: nobody else closes it
                log.info("producer.abandoned", topic=key[0], partition=key[1],
                         transactional_id=tid, init_seconds=round(seconds, 4))
                close_quietly(producer)
                return None  # nothing to tell: the partition is gone
            close_quietly(replaced)
            self._metrics.producer_init_seconds.observe(seconds)
            log.info("producer.ready", topic=key[0], partition=key[1], transactional_id=tid,
                     init_seconds=round(seconds, 4))
            return InitDone(time.monotonic())
        return job

    def write(self, key: TopicPartitionKey, offset: int, outputs: list[Produced]) -> None:
        producer = self._in_transaction(key)
        if outputs:
            producer.produce_all(outputs, offset)

    def write_run(self, key: TopicPartitionKey, run: list[Processed]) -> None:
        self._in_transaction(key).produce_run(run)

    def _in_transaction(self, key: TopicPartitionKey) -> PinnedProducer:
        """The partition's producer, its transaction begun."""
        producer = self._producers[key]
        if not producer.in_transaction:
            producer.begin()
        return producer

    def commit(self, key: TopicPartitionKey, txn: Txn, group_metadata: GroupMetadata) -> Job:
        # Begun here when nothing was written: offsets only, past the commit markers
        # after records committed before (state.ReachedEnd).
        producer = self._in_transaction(key)
        taken = _taken(group_metadata)

        def job() -> Event:
            started = time.monotonic()
            try:
                transaction.commit(producer, txn.next, taken)
            except KafkaOperationError as exc:
                return CommitFailed(exc, producer.take_failures(), time.monotonic())
            return CommitDone(time.monotonic() - started, time.monotonic())
        return job

    def abort(self, key: TopicPartitionKey, txn: Txn | None) -> Job:
        producer = self._producers[key]

        def job() -> Event:
            if producer.in_transaction:
                try:
                    producer.abort()
                except KafkaOperationError as exc:
                    return AbortFailed(exc, time.monotonic())
            return AbortDone(producer.take_failures(), time.monotonic())
        return job

    def finish(self, key: TopicPartitionKey, txn: Txn | None, commit: bool, reason: str,
               group_metadata: GroupMetadata,
               deadline: float | None = None) -> ReleaseJob | None:
        producer = self._detach(key)
        if producer is None:
            return None
        taken = _taken(group_metadata) if commit else group_metadata

        def job() -> ReleaseReport | None:
            try:
                if commit and txn is not None and not producer.in_transaction:
                    _begin_offsets_only(producer)
                if producer.in_transaction:
                    return _finish(producer, txn, commit, reason, taken)
                return None
            finally:
                close_quietly(producer)
        return job

    def detach(self, key: TopicPartitionKey) -> Job:
        """Take the partition's producer out now; the job closes it (run it once the
        job still using it has ended)."""
        producer = self._detach(key)
        return lambda: close_quietly(producer)

    def _detach(self, key: TopicPartitionKey) -> PinnedProducer | None:
        """Out of the registry, and an init still running for ``key`` no longer counts:
        its job closes what it made."""
        with self._lock:
            self._initialising.pop(key, None)
            producer = self._producers.pop(key, None)
            self._metrics.pinned_producers.set(len(self._producers))
        self._metrics.transaction_states.forget(self.transactional_id(key))
        return producer

    def poll(self, now: float) -> list[tuple[TopicPartitionKey, Event]]:
        """Serve the pinned producers' delivery reports here, on the loop thread.

        confluent-kafka takes the GIL for every delivery report, whatever the callback
        (Producer.c, ``dr_msg_cb``). Left to ``commit_transaction``'s flush, a
        transaction's reports would be served on its job thread, each one waiting for
        the busy loop thread to give up the GIL (up to the 1 ms switch interval;
        docs/journal/2026-11-26-delivery-reports-on-loop-thread.md). Failed outputs
        still surface in the transaction's own calls."""
        for producer in list(self._producers.values()):  # init jobs add to it
            producer.poll()
        return []

    def shutdown(self, timeout_s: float) -> None:
        with self._lock:
            keys = set(self._producers) | set(self._initialising)
        for key in keys:
            close_quietly(self._detach(key))




def _begin_offsets_only(producer: PinnedProducer) -> None:
    """A transaction for offsets only (state.ReachedEnd); if it cannot begin, the end
    past the markers is left for the next owner to commit."""
    try:
        producer.begin()
    except KafkaOperationError as exc:
        log.warning("transaction.begin_failed", transactional_id=producer.transactional_id,
                    error=str(exc))


def _taken(group_metadata: GroupMetadata) -> GroupMetadata:
    """The consumer's group metadata taken now, on the loop thread, as the commit
    starts (the freshest generation it can carry), for the job to send beside it."""
    metadata = group_metadata()
    return lambda: metadata


def _finish(producer: PinnedProducer, txn: Txn | None, commit: bool, reason: str,
            group_metadata: GroupMetadata) -> ReleaseReport | None:
    """A released partition's open transaction committed (falling back to an abort)
    or aborted; what it found, for the loop's reporter to count (the job only logs).
    A fence found while giving a partition up counts like one found in flight (a
    paused replica often learns of its successor this way): the successor's
    init_transactions aborted what was open."""
    tid = producer.transactional_id
    if commit and txn is not None:
        started = time.monotonic()
        try:
            transaction.commit(producer, txn.next, group_metadata)
        except RetriableError as exc:  # it may have committed: never abort it
            log.warning("transaction.commit_failed", transactional_id=tid, error=str(exc))
            return None
        except FencedError as exc:  # a fenced producer cannot abort either
            log.warning("producer.fenced", transactional_id=tid, on="release", error=str(exc))
            return ReleaseReport(fenced=True)
        except KafkaOperationError as exc:
            log.warning("transaction.commit_failed", transactional_id=tid, error=str(exc))
        else:
            log.info("transaction.committed_on_release", transactional_id=tid,
                     next_offset=txn.next, records=txn.records)
            return ReleaseReport(committed_s=time.monotonic() - started, records=txn.records)
    try:
        producer.abort()
    except FencedError as exc:
        log.warning("producer.fenced", transactional_id=tid, on="release", error=str(exc))
        return ReleaseReport(fenced=txn is not None)
    except KafkaOperationError as exc:  # closing anyway: the next owner's init aborts it
        log.warning("transaction.abort_failed", transactional_id=tid, error=str(exc))
        return None
    log.info("transaction.aborted", transactional_id=tid, reason=reason)
    return ReleaseReport(aborted=reason)
