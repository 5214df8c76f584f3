"""At-least-once: one idempotent producer for the replica; consumer offsets are
committed once every output before them was delivered.

Each partition writes into delivery *windows*; a commit seals the open window.
Every output's delivery report is attributed to its window, so a failure is
blamed on its own partition and record, never on whichever partitions happen to
be due. Offsets advance only across sealed windows whose outputs were all
delivered, and are committed asynchronously: the loop never waits for a flush.
A failed window makes its partition rewind to the offset committed in Kafka;
a refused output's record is dead-lettered, as in exactly-once mode. A flowing
partition's outputs are written unnamed; after a failure among them the records up
to it are written again naming their records, so a refusal that repeats names its
own. When the broker refuses a whole batch, every record it names is dead-lettered
(there is no transaction to bisect with).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import cast

import structlog
from confluent_kafka import KafkaError, Message, Producer, TopicPartition

from service.contract.processing import Processed, Produced, written_before
from service.errors import Failure, KafkaOperationError, Where
from service.kafka.config import producer_config
from service.kafka.producer import send_outputs, send_run
from service.observability.logs import error_cb, librdkafka_logger
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage.guarantees.guarantee import GroupMetadata, Job
from service.stage.machine import AbortDone, CommitDone, DeliveryFailed, Event, InitDone, Txn
from service.stage.partition import TopicPartitionKey

log = structlog.get_logger(__name__)

CommitOffsets = Callable[[list[TopicPartition], bool], None]  # (offsets, asynchronous)
_FLUSH_ON_RELEASE_S = 10.0


class _Reports:
    """The failures among one window's delivery reports. (Apart from the window: the
    callbacks bound to it must not hold the window, or each would be a cycle.)"""

    __slots__ = ("dead", "failures")

    def __init__(self) -> None:
        self.dead = False      # its partition rewound: late reports do not matter
        self.failures: list[Failure] = []

    def report(self, offset: int | None, error: KafkaError | None, message: Message) -> None:
        """on_delivery, bound to the input record's offset (delivery reports carry no
        headers) or to None (written unnamed), on the thread that polls; never
        raises. With ``delivery.report.only.error`` it runs for failures only."""
        if error is not None and not self.dead:
            self.failures.append(Failure(error.code(), error.name(), error.str(), offset))


class Window:
    """The outputs of a run of input records of one partition.

    What is still in flight is counted without a Python call per delivered output.
    confluent-kafka holds each queued output's callback until librdkafka serves its
    report, then drops it, calling it only for a failure
    (``delivery.report.only.error``). A flowing partition's outputs all share one
    callback (``unnamed``); a record written named gets a ``partial`` of ``named``.
    So the two callbacks' reference counts above their idle values say whether
    anything is in flight. A Python call per delivered output,
    or a callback object per record, cost at-least-once more than the rest of its
    bookkeeping (docs/journal/2026-11-26-at-least-once-delivery-reports.md)."""

    __slots__ = ("_idle", "_reports", "named", "next", "sealed", "unnamed")

    def __init__(self, first: int) -> None:
        self.next = first
        self.sealed = False    # no more records join it
        self._reports = _Reports()
        self.named = self._reports.report         # partial(named, offset) per record
        self.unnamed = partial(self.named, None)  # the same object for every output
        self._idle = sys.getrefcount(self.named) + sys.getrefcount(self.unnamed)

    @property
    def failures(self) -> list[Failure]:
        return self._reports.failures

    def kill(self) -> None:
        self._reports.dead = True

    @property
    def in_flight(self) -> int:
        """Outputs written unnamed plus records written named, not yet reported."""
        return sys.getrefcount(self.named) + sys.getrefcount(self.unnamed) - self._idle

    @property
    def delivered(self) -> bool:
        return self.sealed and not self._reports.failures and self.in_flight == 0


class AtLeastOnce:
    def __init__(self, settings: Settings, metrics: Metrics, commit_offsets: CommitOffsets, *,
                 message_max_bytes: int | None = None) -> None:
        self._metrics = metrics
        self._commit_offsets = commit_offsets
        self._interval_s = settings.commit_interval_ms / 1000
        self._producer = Producer({
            **producer_config(settings, None, message_max_bytes=message_max_bytes),
            "logger": librdkafka_logger("producer"),
            "error_cb": error_cb("producer"),
            "delivery.report.only.error": True,  # successes are counted by Window
        })
        self._windows: dict[TopicPartitionKey, deque[Window]] = {}
        self._open: dict[TopicPartitionKey, Window] = {}
        self._blamed: set[TopicPartitionKey] = set()   # failure reported, not yet aborted
        self._deliverable: dict[TopicPartitionKey, int] = {}  # delivered, not yet committed
        self._sent: dict[TopicPartitionKey, int] = {}  # the newest offset sent to commit
        self._owned: set[TopicPartitionKey] = set()
        self._next_commit = 0.0

    def transactional_id(self, key: TopicPartitionKey) -> None:
        return None

    def init(self, key: TopicPartitionKey, replacing: bool = False) -> Job:
        self._forget(key)
        self._owned.add(key)
        self._sent.pop(key, None)
        return lambda: InitDone(time.monotonic())

    def write(self, key: TopicPartitionKey, offset: int, outputs: list[Produced]) -> None:
        window = self._window(key, offset)
        report = partial(window.named, offset)  # one callback object per record, not per output
        where = Where("produce", None, key[0], key[1], offset)
        send_outputs(self._producer, outputs, report, where)
        window.next = offset + 1

    def write_run(self, key: TopicPartitionKey, run: list[Processed]) -> None:
        window = self._window(key, run[0][0].offset)
        report = window.unnamed  # the same object for every output of the window
        try:
            send_run(self._producer, run, report, key[0], key[1])
        except KafkaOperationError as exc:
            written = written_before(run, cast(int, exc.where.offset))
            if written:
                window.next = run[written - 1][0].offset + 1
            raise
        window.next = run[-1][0].offset + 1

    def _window(self, key: TopicPartitionKey, first: int) -> Window:
        window = self._open.get(key)
        if window is None:
            window = self._open[key] = Window(first)
            self._windows.setdefault(key, deque()).append(window)
        return window

    def commit(self, key: TopicPartitionKey, txn: Txn, group_metadata: GroupMetadata) -> Event:
        self._seal(key, txn)
        return CommitDone(-1.0, time.monotonic())  # sealed; its offsets commit once delivered

    def _seal(self, key: TopicPartitionKey, txn: Txn | None) -> None:
        """Seal the open window at ``txn.next``: past the records it holds when the
        partition read past commit markers after them (state.ReachedEnd). A "commit"
        of no records has no window: one is made, for those offsets alone."""
        window = self._open.pop(key, None)
        if window is None and txn is not None and not txn.records:
            window = Window(txn.next)
            self._windows.setdefault(key, deque()).append(window)
        if window is not None:
            if txn is not None:
                window.next = max(window.next, txn.next)
            window.sealed = True

    def abort(self, key: TopicPartitionKey, txn: Txn | None) -> Event:
        """Nothing sent can be recalled: forget the windows; what follows the
        committed offset is sent again (duplicates, never loss)."""
        self._forget(key)
        return AbortDone((), time.monotonic())

    def _forget(self, key: TopicPartitionKey) -> None:
        for window in self._windows.pop(key, ()):
            window.kill()
        self._open.pop(key, None)
        self._blamed.discard(key)
        self._deliverable.pop(key, None)

    def poll(self, now: float) -> list[tuple[TopicPartitionKey, Event]]:
        """Serve delivery reports; blame failures; commit what was delivered."""
        self._producer.poll(0)
        events: list[tuple[TopicPartitionKey, Event]] = []
        for key, windows in self._windows.items():
            while windows and windows[0].delivered:
                self._deliverable[key] = windows.popleft().next
            failed = [f for window in windows for f in window.failures]
            if failed and key not in self._blamed:
                self._blamed.add(key)
                through = max(w.next for w in windows if w.failures)
                events.append((key, DeliveryFailed(tuple(failed), now, through)))
        if self._deliverable and now >= self._next_commit:
            self._next_commit = now + self._interval_s
            self._commit(False)
        return events

    def _commit(self, wait: bool, keys: set[TopicPartitionKey] | None = None) -> None:
        chosen = {k: o for k, o in self._deliverable.items() if keys is None or k in keys}
        if not chosen:
            return
        for key, offset in chosen.items():
            del self._deliverable[key]
            self._sent[key] = offset
        offsets = [TopicPartition(topic, partition, offset)
                   for (topic, partition), offset in chosen.items()]
        started = time.monotonic()
        self._commit_offsets(offsets, not wait)
        if wait:
            self._metrics.commit_seconds.observe(time.monotonic() - started)

    def offsets_committed(self, error: KafkaError | None,
                          partitions: list[TopicPartition]) -> bool:
        """The result of an asynchronous commit (served by the consumer's poll, on the
        loop thread; never raises). A failed offset is committed again at the next
        interval unless a newer one was sent since: once the input stops nothing else
        would ever commit it, and a rebalance's ILLEGAL_GENERATION would leave
        partitions behind for good (docs/journal/2026-11-23-at-least-once-campaign.md).

        True when Kafka confirmed a commit: it counts (transactions committed, the
        last commit's time, by the loop's reporter) once Kafka said so here, not when
        a window was sealed nor when the commit was sent."""
        for tp in partitions:
            if error is None and tp.error is None:
                continue
            key = (tp.topic, tp.partition)
            if key in self._owned and tp.offset >= self._sent.get(key, -1):
                self._deliverable[key] = max(tp.offset, self._deliverable.get(key, -1))
        return error is None and any(tp.error is None for tp in partitions)

    def finish(self, key: TopicPartitionKey, txn: Txn | None, commit: bool, reason: str,
               group_metadata: GroupMetadata, deadline: float | None = None) -> None:
        """Revoked or stopping, healthy: seal the open window (if any), wait for the
        partition's outputs in flight (until ``deadline``, at most 10 s), then commit
        what was delivered, synchronously and on the loop thread (inside the
        rebalance callback: a consumer's synchronous calls must not come from another
        thread). With no window open too: windows sealed earlier still wait for their
        offsets to be committed. A failed commit only means the next owner sends
        those outputs again; so does an output still in flight at the deadline.

        The wait is the release's, not each partition's: waiting 10 s for each of
        eight revoked partitions while the broker does not answer would take 80 s, in
        which the loop serves nothing and the group's rebalance stands still."""
        if commit:
            self._seal(key, txn)
            windows = self._windows.get(key, deque())
            if any(window.in_flight for window in windows):  # (the producer is shared)
                wait = _FLUSH_ON_RELEASE_S if deadline is None else min(
                    _FLUSH_ON_RELEASE_S, deadline - time.monotonic())
                if wait > 0:
                    self._producer.flush(wait)
            while windows and windows[0].delivered:
                self._deliverable[key] = windows.popleft().next
            try:
                self._commit(True, {key})
            except KafkaOperationError as exc:
                log.warning("offsets.commit_failed", topic=key[0], partition=key[1],
                            error=str(exc))
        self._forget(key)
        self._owned.discard(key)

    def detach(self, key: TopicPartitionKey) -> Job:
        self._forget(key)
        self._owned.discard(key)  # the shared producer stays; late reports no longer count
        return lambda: None

    def shutdown(self, timeout_s: float) -> None:
        self._producer.flush(max(timeout_s, 0.0))
