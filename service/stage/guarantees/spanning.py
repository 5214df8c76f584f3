"""Exactly-once with one transaction spanning every partition a replica owns
(``TXSTAGE_TRANSACTIONS=spanning``, KIP-447, as Kafka Streams' exactly_once_v2).

Fencing is the group's: the offsets carry the group metadata taken as the commit
starts, and the coordinator refuses them from a zombie (a generation that passed).
The producer lives in a *generation* (generation.py): made by the first partition's
init, joined by the others'. A commit is a *round*: the loop gathers every active
partition into it (stage/span.py), then seals it; the first of its jobs sends every
offset and commits, each job reports for its own partition. A partition that turns
active while a round runs joins it empty and waits: nothing is written into a
transaction while it commits. An abort ends the generation: every member reads again
from Kafka, and a fresh init makes or joins the next (its init_transactions, under
the same id, bumps the epoch, as a per-partition producer's does after an abort).
"""

from __future__ import annotations

import threading
import time

import structlog
from confluent_kafka import KafkaError

from service.contract.processing import Processed, Produced
from service.errors import (
    AbortableError,
    FencedError,
    KafkaOperationError,
    RetriableError,
    Where,
)
from service.kafka.config import producer_config
from service.kafka.spanning_producer import SpanningProducer
from service.observability.logs import error_cb, librdkafka_logger
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage.guarantees.generation import (
    Generation,
    Round,
    close_gen,
    shared_abort,
    transactional_id,
)
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


class Spanning:
    """The replica's generations of one shared transactional producer."""

    def __init__(self, settings: Settings, metrics: Metrics, *,
                 message_max_bytes: int | None = None) -> None:
        self._settings = settings
        self._metrics = metrics
        self._message_max_bytes = message_max_bytes
        self._tid = transactional_id(settings)
        self._lock = threading.Lock()
        self._current: Generation | None = None
        self._previous: Generation | None = None  # the last one ended: its abort first
        self._member_of: dict[TopicPartitionKey, Generation] = {}
        self._initialising: dict[TopicPartitionKey, object] = {}
        self._open: Round | None = None  # being gathered on the loop thread, not sealed
        self._spread: set[TopicPartitionKey] = set()  # to abort with the one that ended it
        self._logger = librdkafka_logger("producer")
        self._deadline_s = settings.call_deadline_s

    def transactional_id(self, key: TopicPartitionKey) -> str:
        return self._tid

    # -- the loop's side of a round (stage/span.py) ------------------------------

    @property
    def gathering(self) -> bool:
        """A round is open: the loop gathers every active partition, then seals it."""
        return self._open is not None

    def seal(self) -> None:
        """Every partition has joined the open round: its jobs may commit it."""
        opened, self._open = self._open, None
        if opened is not None:
            opened.sealed.set()

    def must_wait(self, key: TopicPartitionKey) -> bool:
        """The partition just became active while its generation commits or has
        ended: it may write nothing until that is over (it joins, empty)."""
        gen = self._member_of.get(key)
        return gen is None or gen.ended or gen.in_flight is not None

    def take_spread(self) -> set[TopicPartitionKey]:
        """The other members of a generation an abort (or a lost partition) just
        ended, once: the loop aborts each of them too (SpanAborted)."""
        spread, self._spread = self._spread, set()
        return spread

    # -- Guarantee -----------------------------------------------------------------

    def init(self, key: TopicPartitionKey, replacing: bool = False) -> Job:
        token = object()
        with self._lock:
            self._initialising[key] = token

        def job() -> Event | None:
            deadline = time.monotonic() + self._deadline_s
            while True:
                with self._lock:
                    if self._initialising.get(key) is not token:
                        return None  # given up meanwhile
                    gen, making = self._current, False
                    if gen is None or gen.ended:
                        gen = self._current = Generation()
                        making = True
                        previous = self._previous
                if making:
                    self._make(gen, previous, replacing, deadline)
                elif not gen.ready.wait(max(deadline - time.monotonic(), 0)):
                    return InitFailed(RetriableError(
                        Where("init_transactions", self._tid, *key),
                        KafkaError(KafkaError._TIMED_OUT, "the replica's producer was not "
                                   "ready in time")), time.monotonic())
                if gen.failed is not None:
                    return InitFailed(gen.failed, time.monotonic())
                with self._lock:
                    if self._initialising.get(key) is not token:
                        return None
                    if gen is self._current and not gen.ended:
                        del self._initialising[key]
                        gen.members.add(key)
                        self._member_of[key] = gen
                        return InitDone(time.monotonic())
                # It ended while this waited: join (or make) the next one.
        return job

    def _make(self, gen: Generation, previous: Generation | None, replacing: bool,
              deadline: float) -> None:
        """The generation's producer, its transactions initialised (on a job thread).
        Its init_transactions fences the previous generation's producer: that one's
        abort runs first."""
        if previous is not None:
            previous.aborted.wait(max(deadline - time.monotonic(), 0))
        started = time.monotonic()
        producer = None
        try:
            config = {**producer_config(self._settings, self._tid,
                                        message_max_bytes=self._message_max_bytes),
                      "logger": self._logger}
            producer = SpanningProducer(config, self._settings.input_topics[0],
                                        deadline_s=self._deadline_s,
                                        on_error=error_cb(self._tid),
                                        connect_first=not replacing)
            producer.init()
        except KafkaOperationError as exc:
            log.error("producer.init_failed", transactional_id=self._tid, error=str(exc))
            if producer is not None:
                producer.close()
            with self._lock:
                gen.failed, gen.ended = exc, True
                if self._current is gen:
                    self._current = None
            gen.ready.set()
            gen.aborted.set()
            return
        gen.producer = producer
        seconds = time.monotonic() - started
        self._metrics.producer_init_seconds.observe(seconds)
        self._metrics.pinned_producers.set(1)
        log.info("producer.ready", transactional_id=self._tid, spanning=True,
                 init_seconds=round(seconds, 4))
        gen.ready.set()

    def _producer(self, key: TopicPartitionKey) -> SpanningProducer:
        """The partition's generation's producer, its transaction begun; a generation
        that ended (or a commit under way: never, the loop holds such partitions)
        raises SharedAbortError, and the partition aborts and reads again."""
        gen = self._member_of.get(key)
        if gen is None or gen.ended or gen.in_flight is not None or gen.producer is None:
            raise shared_abort("produce", self._tid,
                                "the replica's transaction ended for another partition")
        producer = gen.producer
        if not producer.in_transaction:
            producer.begin()
        return producer

    def write(self, key: TopicPartitionKey, offset: int, outputs: list[Produced]) -> None:
        producer = self._producer(key)
        if outputs:
            producer.produce_for(key, outputs, offset)

    def write_run(self, key: TopicPartitionKey, run: list[Processed]) -> None:
        self._producer(key).produce_run_for(key, run)

    def commit(self, key: TopicPartitionKey, txn: Txn, group_metadata: GroupMetadata) -> Job:
        gen = self._member_of.get(key)
        if gen is None or gen.ended:
            error = shared_abort("commit_transaction", self._tid,
                                  "the replica's transaction ended for another partition")
            return lambda: CommitFailed(error, (), time.monotonic())
        waited = gen.in_flight
        if waited is not None and waited is not self._open:
            return self._joined(key, waited, txn)  # active while it commits: waits, empty
        if self._open is not None and gen.in_flight is not self._open:
            error = shared_abort("commit_transaction", self._tid,
                                  "the partition's producer is not the one committing")
            return lambda: CommitFailed(error, (), time.monotonic())
        if self._open is None:
            self._open = Round(group_metadata())  # on the loop thread, as it starts
            gen.in_flight = self._open
        opened = self._open
        opened.members.add(key)
        if not txn.empty and txn.next >= 0:
            opened.offsets[key] = txn.next
        producer = gen.producer

        def job() -> Event:
            opened.sealed.wait()
            self._run_round(gen, opened, producer)
            return self._outcome(key, opened)
        return job

    def _joined(self, key: TopicPartitionKey, waited: Round, txn: Txn) -> Job:
        def job() -> Event:
            waited.done.wait()
            if waited.error is not None or not txn.empty:
                return CommitFailed(shared_abort(
                    "commit_transaction", self._tid,
                    "the replica's transaction failed for another partition"), (),
                    time.monotonic())
            return CommitDone(0.0, time.monotonic())
        return job

    def _run_round(self, gen: Generation, round_: Round,
                   producer: SpanningProducer | None) -> None:
        """Once per round, on the first of its jobs: every offset, then the commit."""
        with round_.lock:
            if round_.ran:
                return
            round_.ran = True
            started = time.monotonic()
            try:
                if producer is None:
                    raise shared_abort("commit_transaction", self._tid, "no producer")
                if round_.offsets and not producer.in_transaction:
                    producer.begin()  # offsets only: past markers, or records all filtered
                if producer.in_transaction:
                    producer.send_offsets_of(round_.offsets, round_.group_metadata)
                    producer.commit()
            except KafkaOperationError as exc:
                round_.error = exc
                if producer is not None:
                    round_.failures = {k: producer.take_failures_of(k) for k in round_.members}
                if isinstance(exc, FencedError | RetriableError):
                    self._end(gen)  # never published under again
            round_.seconds = time.monotonic() - started
            gen.in_flight = None
            round_.done.set()
        with self._lock:  # its members all left while it committed: nobody closes it
            closing = not gen.members and not gen.closing
            if closing:
                gen.closing = True
                self._retire(gen)
        if closing:
            close_gen(gen)

    def _outcome(self, key: TopicPartitionKey, round_: Round) -> Event:
        error = round_.error
        if error is None:
            return CommitDone(round_.seconds, time.monotonic())
        failures = round_.failures.get(key, ())
        if not failures and isinstance(error, AbortableError) and any(
                round_.failures.values()):
            # Another member's outputs failed: this one aborts with it, and neither counts
            # the abort nor looks for a refused record of its own.
            error = shared_abort("commit_transaction", self._tid,
                                 f"aborted for another partition's failed output: {error}")
        return CommitFailed(error, failures, time.monotonic())

    def abort(self, key: TopicPartitionKey, txn: Txn | None) -> Job:
        gen = self._member_of.get(key)
        if gen is not None and self._end(gen):
            self._spread |= gen.members - {key}

        def job() -> Event:
            if gen is None:
                return AbortDone((), time.monotonic())
            error = self._abort_once(gen)
            if error is not None:
                return AbortFailed(error, time.monotonic())
            failures = gen.producer.take_failures_of(key) if gen.producer is not None else ()
            return AbortDone(failures, time.monotonic())
        return job

    def _end(self, gen: Generation) -> bool:
        """No new transaction in ``gen``; the next init makes another generation. True
        when it was live until now."""
        with self._lock:
            live = not gen.ended
            self._retire(gen)
            return live

    def _retire(self, gen: Generation) -> None:
        """(under ``_lock``)"""
        gen.ended = True
        if self._current is gen:
            self._current, self._previous = None, gen

    def _abort_once(self, gen: Generation) -> KafkaOperationError | None:
        """The generation's transaction aborted, by the first of its members' jobs
        (after the commit under way, if any: never both at once)."""
        waited = gen.in_flight
        if waited is not None:
            waited.done.wait(self._deadline_s)
        with gen.abort_lock:
            if not gen.abort_ran:
                gen.abort_ran = True
                producer = gen.producer
                try:
                    if producer is not None and producer.in_transaction:
                        producer.abort()
                        log.info("transaction.aborted", transactional_id=self._tid,
                                 spanning=True)
                except KafkaOperationError as exc:
                    gen.abort_error = exc
                finally:
                    gen.aborted.set()
            return gen.abort_error

    def finish(self, key: TopicPartitionKey, txn: Txn | None, commit: bool, reason: str,
               group_metadata: GroupMetadata,
               deadline: float | None = None) -> ReleaseJob | None:
        """The loop committed every partition before a healthy release (stage/span.py):
        whatever is still open here cannot be committed alone, so the replica's
        transaction is aborted (the loop rewinds the partitions that stay)."""
        gen = self._member_of.get(key)
        must_abort = gen is not None and not gen.ended and txn is not None and not txn.empty
        if must_abort and gen is not None and self._end(gen):
            self._spread |= gen.members - {key}
        closing = self._leave(key)

        def job() -> ReleaseReport | None:
            report = None
            if must_abort and gen is not None:
                error = self._abort_once(gen)
                report = ReleaseReport(aborted=reason) if error is None else None
            close_gen(closing)
            return report
        return job

    def detach(self, key: TopicPartitionKey) -> Job:
        closing = self._leave(key)
        return lambda: close_gen(closing)

    def _leave(self, key: TopicPartitionKey) -> Generation | None:
        """The partition is no member any more; its generation, to close, when it was
        the last member (and no commit runs in it: the commit's job closes it then)."""
        with self._lock:
            self._initialising.pop(key, None)
            gen = self._member_of.pop(key, None)
            if gen is None:
                return None
            gen.members.discard(key)
            if gen.members or gen.in_flight is not None or gen.closing:
                return None
            gen.closing = True
            self._retire(gen)
            self._metrics.pinned_producers.set(0 if self._current is None else 1)
            return gen

    def poll(self, now: float) -> list[tuple[TopicPartitionKey, Event]]:
        """Delivery reports served on the loop thread (ExactlyOnce.poll says why)."""
        gen = self._current
        if gen is not None and gen.producer is not None:
            gen.producer.poll()
        return []

    def shutdown(self, timeout_s: float) -> None:
        with self._lock:
            keys = set(self._member_of) | set(self._initialising)
        for key in keys:
            close_gen(self._leave(key))
        with self._lock:  # made for a partition given up while its init ran: no member
            left = self._current
            if left is not None and not left.members and not left.closing:
                left.closing = True
                self._retire(left)
            else:
                left = None
        close_gen(left)
