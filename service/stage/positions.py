"""Where a partition resumes: the committed offset looked up in Kafka, the seek
landed and the first record checked against it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import cast

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    TopicPartition,
)

from service.errors import (
    KafkaOperationError,
    RetriableError,
    Where,
)
from service.kafka.cluster import Cluster
from service.kafka.seek import reassign, seek
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage import machine as sm
from service.stage.guarantees.guarantee import Job
from service.stage.overruns import OverrunBook
from service.stage.partition import Partition, TopicPartitionKey

log = structlog.get_logger(__name__)

_LOOKUP_RETRY_S = 0.2
_READING = (sm.Phase.ACTIVE, sm.Phase.COMMITTING)  # records are processed or held
_STABLE_READ_S = 5.0


class Positions:
    """Where each partition of the loop resumes, and the seek that gets it there:
    seeking, landing and retrying seeks, re-assigning partitions librdkafka never
    started, checking the first record after a seek, and looking committed offsets
    up. Each partition's seek is kept on it (``Partition.seek``, a ``Positioning``);
    the consume() batch count is this object's own. ``discard``: forget what a
    partition holds or has out (the runner's), as a seek makes it stale."""

    def __init__(self, consumer: Consumer, metrics: Metrics, settings: Settings,
                 partitions: Mapping[TopicPartitionKey, Partition],
                 discard: Callable[[Partition], None], stall_after_s: float) -> None:
        self._consumer = consumer
        self._metrics = metrics
        self._settings = settings
        self._partitions = partitions
        self._discard = discard
        self._stall_after_s = stall_after_s  # TXSTAGE_FETCH_STALL_S (0: the watch is off)
        self._no_offset = OFFSET_END if settings.starts_at_end else OFFSET_BEGINNING
        self.batch = 0  # consume() calls so far: a seek made in this one makes its records stale

    def next_batch(self) -> None:
        """consume() returned: what it fetched comes after every seek made so far."""
        self.batch += 1

    def stale(self, partition: Partition, offset: int) -> bool:
        """A record fetched before the partition's last seek: it is read again."""
        return offset < partition.position or partition.seek.stale(self.batch)

    def seek(self, partition: Partition, offset: int) -> None:
        """Fetch the partition from ``offset`` (< 0: none committed), and make sure of it.

        librdkafka refuses a seek with _STATE while the partition is not fetching yet
        (just assigned, its own committed-offset query still out). Its fetcher then
        starts where that query says, but a refused seek also leaves librdkafka's
        "application position" as it was, and every later pause moves the fetcher to
        that position (rdkafka_partition.c). After a rebalance served inside consume()
        that position can belong to records of the previous assignment, far ahead
        (rdkafka_queue.c updates it after the callbacks), so the partition can resume
        far past the offset Kafka committed (docs/state-machine.md, "A seek is checked,
        not trusted"). So a
        refused seek keeps the partition paused and is retried until it lands, and the
        first record fetched after it must be at ``offset``: fetched from beyond it, the
        seek is made once more (a gap that persists is real: transaction markers,
        compaction, retention)."""
        offset = partition.seek.sought_at(offset, self.batch)
        self._discard(partition)  # fetched before the seek: read again after it
        partition.position = max(offset, 0)
        partition.fetched_end = None
        log.debug("partition.positioned", topic=partition.topic, partition=partition.partition,
                  committed_offset=offset)
        if not self._land_seek(partition):
            log.info("partition.seek_deferred", topic=partition.topic,
                     partition=partition.partition, offset=offset,
                     note="librdkafka is not fetching it yet: paused, the seek is retried")

    def _land_seek(self, partition: Partition) -> bool:
        offset = partition.seek.seek_to
        if offset is None:
            return True
        target = offset if offset >= 0 else self._no_offset
        if not seek(self._consumer, TopicPartition(partition.topic, partition.partition, target),
                    Where("seek", None, partition.topic, partition.partition, offset)):
            self._consumer.pause([partition.tp])  # until the seek lands (tick retries it)
            partition.refresh_flowing()
            return False
        partition.seek.landed()
        partition.refresh_flowing()
        return True

    def restart_fetch(self, partition: Partition) -> None:
        """A fetcher librdkafka left stalled (the housekeeper found it): restart it
        where the partition stands."""
        self._consumer.pause([partition.tp])
        self._consumer.resume([partition.tp])
        self.seek(partition, partition.seek.restart_at(partition.position))

    def retry(self, now: float) -> None:
        """Land the seeks refused so far; past TXSTAGE_FETCH_STALL_S, re-assign."""
        refused: list[Partition] = []
        stall_s = self._stall_after_s
        for partition in self._partitions.values():
            sought = partition.seek
            if sought.seek_to is None or partition.releasing:
                continue
            if self._land_seek(partition):
                if not partition.state.paused:
                    self._consumer.resume([partition.tp])
            elif sought.refused_since is None:
                sought.refused_since = now
            elif stall_s > 0 and now - sought.refused_since >= stall_s:
                refused.append(partition)
        if refused:
            self._reassign(refused, now)

    def _reassign(self, partitions: list[Partition], now: float) -> None:
        """Seeks refused for longer than TXSTAGE_FETCH_STALL_S: librdkafka never
        started these partitions' fetchers. Its own committed-offset query (OffsetFetch)
        can fail as a whole with NOT_COORDINATOR and is then never retried, which
        leaves a partition assigned and unfetched for good (librdkafka#5586). The
        remedy is librdkafka's own: assign them afresh, here at the offsets Kafka
        committed (the stage's lookups), so librdkafka asks the coordinator nothing
        and starts each fetcher there.

        All in one unassign and one assign: each bumps librdkafka's assignment
        version, which drops an offset query still out for other partitions. They
        stay paused (librdkafka keeps an application's pause across an unassign) and
        their seeks stay pending: the next tick's lands on the started fetcher, which
        also clears librdkafka's application position (a pause would move the
        fetcher there; see seek). A failure of these calls leaves librdkafka's
        assignment unlike the stage's: it is fatal, and the replica's restart assigns
        everything afresh. A rebalance librdkafka has queued but not yet called back
        (the window is one tick) would take these calls as the application's answer
        (rdkafka_cgrp.c); its callbacks still run, and fencing keeps every output
        exactly once."""
        targets = []
        for partition in partitions:
            offset = cast(int, partition.seek.seek_to)
            log.warning("partition.reassigned", topic=partition.topic,
                        partition=partition.partition, offset=offset,
                        refused_s=round(now - cast(float, partition.seek.refused_since), 1),
                        note="librdkafka refused every seek: its fetcher never started "
                             "(librdkafka#5586); the partition is assigned afresh at the "
                             "committed offset")
            self._metrics.fetch_stalls.inc()
            partition.seek.refused_since = None  # still refused: the clock starts again
            targets.append(TopicPartition(partition.topic, partition.partition,
                                          offset if offset >= 0 else self._no_offset))
        reassign(self._consumer, targets, Where("reassign"))

    def check_first(self, partition: Partition, offset: int) -> bool:
        """The first record after a seek to ``partition.position``; False when it came
        from beyond it and the seek is made again. Once more from beyond it, the gap is
        real (transactional input: the committed offset is often a commit marker)."""
        expected = partition.position
        sought = partition.seek
        if sought.sought < 0 and self._no_offset == OFFSET_END:
            # Nothing committed, auto.offset.reset=latest: where the log ended is not
            # known here (checked against 0 it would be sought again, to 0: the whole
            # history). This record is where the partition starts, and where it goes
            # back to while nothing is committed (an abort, a poison retry): sought
            # to the end again, the records since would be skipped.
            sought.started_at = partition.position = offset
            expected = offset
        if offset > expected and sought.rechecked is None:
            self.seek(partition, expected)
            sought.rechecked = offset
            return False
        if sought.rechecked is not None and offset < sought.rechecked:
            log.warning("partition.fetch_position_corrected", topic=partition.topic,
                        partition=partition.partition, position=expected,
                        fetched_first=sought.rechecked,
                        note="the fetcher started beyond the committed offset; sought again")
            self._metrics.kafka_errors.labels(op="fetch_position", action="seek").inc()
        sought.first_checked()
        partition.refresh_flowing()
        return True

    def fetched_to_end(self, partition: Partition, end: int) -> None:
        """The fetcher reached the partition's end at ``end`` (PARTITION_EOF): past
        commit markers and aborted records, which take offsets that are never
        delivered. Kept with the offset the records fetched before it lead to (the
        last one out in workers, else held, else the position): once they are
        processed the partition has read up to ``end`` (``Partition.read_to``). An end
        from before a seek says nothing of the records after it; the first one after a
        seek is checked like a record (``check_first``: beyond the sought offset,
        sought once more). Nor while records are dropped to be read again (a waiting
        phase, a backoff)."""
        state = partition.state
        if partition.seek.stale(self.batch) \
                or partition.releasing or state.phase not in _READING \
                or (state.pauses and sm.Pause.BACKOFF in state.pauses):
            return
        held = partition.held
        fetched = held[-1].offset() + 1 if held else partition.position  # type: ignore[operator]
        if partition.inflight:  # out in workers: after every record held
            fetched = partition.inflight_next
        if end < fetched:
            return
        if partition.seek.check_first and not held and end > fetched:
            if not self.check_first(partition, end):
                return
            fetched = partition.position  # (latest, nothing committed: it starts here)
        partition.fetched_end = (fetched, end)

    @staticmethod
    def end_reached(partition: Partition, now: float) -> sm.ReachedEnd | None:
        """A partition idle at an end past its last processed record: the state
        machine moves what it commits there (the event, for the loop to dispatch)."""
        end = partition.fetched_end
        if end is None or end[0] != partition.position or partition.held or partition.inflight:
            return None
        state = partition.state
        txn = state.txn
        if end[1] > (txn.next if txn is not None else state.committed):
            return sm.ReachedEnd(end[0], end[1], now)
        return None

    def lookup(self, partition: Partition, cluster: Cluster, overruns: OverrunBook | None,
               after_commit: bool = False) -> Job:
        """The offset committed in Kafka. Asked with RequireStable, so a transaction
        still holding offsets for the partition settles first. This runs only after
        this replica's own init_transactions or abort_transaction returned, and both
        return only once every earlier transaction of the partition's id is
        complete; so when the broker does not answer a stable read in time (after a
        broker restart, say), the plain committed offset is just as right. Not
        ``after_commit`` (a poison retry's reposition): commit_transaction returns
        once the coordinator has decided, before the markers that apply the
        transaction's offsets are written, and a plain read then may give the offset
        before it (its records would be processed twice). That lookup reads stable
        only, until the deadline."""
        topic, number = partition.key
        deadline = time.monotonic() + self._settings.call_deadline_s
        group, assigned_at = self._settings.group_id, partition.assigned_at

        def job() -> sm.Event:
            stable = True
            while True:
                try:
                    offset = cluster.committed_offset(group, topic, number, require_stable=stable,
                                                      timeout_s=_STABLE_READ_S)
                    # A transform call an earlier owner saw overrun (stage/transform_watch.py).
                    overrun = overruns.entry(topic, number, assigned_at) if overruns else None
                    return sm.Positioned(offset, time.monotonic(), overrun)
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
