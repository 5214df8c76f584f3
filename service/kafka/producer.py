"""PinnedProducer: the only class that touches a transactional producer.

One instance stands for one input partition (``transactional.id`` =
``<prefix>.<topic>.<partition>``); a SpanningProducer for all of a replica's
(TXSTAGE_TRANSACTIONS=spanning). Every librdkafka call goes through
``errors.translate`` so callers see txstage's error classes; retriable errors
are retried here, with the same arguments, until ``deadline_s`` runs out.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from service.contract.processing import Processed, Produced
from service.errors import (
    AbortableError,
    Failure,
    FatalError,
    KafkaOperationError,
    RetriableError,
    Where,
)
from service.kafka.config import Config
from service.kafka.delivery import DeliveryFailures
from service.kafka.errors import classify, kafka_error, translate
from service.kafka.retry import retry_until

log = structlog.get_logger(__name__)
T = TypeVar("T")

_QUEUE_FULL_WAIT_S = 0.05
_MIN_CALL_S = 0.1
_RETRY_PAUSE_S = 0.05
_WARM_UP_S = 5.0  # the metadata request before init_transactions (see PinnedProducer.init)
# How long a bare _FATAL waits for librdkafka to queue its cause (see _fatal_cause).
_FATAL_CAUSE_WAIT_S = 0.5


def produce(producer: Producer, out: Produced,
            on_delivery: Callable[[KafkaError | None, Message], None] | None = None, *,
            partition: int | None = None) -> None:
    """Queue one output (to ``partition`` if given, else where the partitioner puts
    it); wait (serving callbacks) while the local queue is full."""
    extra: dict[str, object] = {} if on_delivery is None else {"on_delivery": on_delivery}
    if partition is not None:
        extra["partition"] = partition
    while True:
        try:
            producer.produce(out.topic, out.value, out.key,
                             headers=out.headers, **extra)  # type: ignore[arg-type]
            return
        except BufferError:
            producer.poll(_QUEUE_FULL_WAIT_S)



Report = Callable[[KafkaError | None, Message], None]


def send_outputs(producer: Producer, outputs: Iterable[Produced], on_delivery: Report,
                 where: Where) -> None:
    """Queue one input record's outputs on a shared (non-transactional) producer; a
    refusal raises its translated error naming ``where``."""
    for out in outputs:
        try:
            producer.produce(out.topic, out.value, out.key, headers=out.headers,  # type: ignore[arg-type]
                             on_delivery=on_delivery)
        except BufferError:
            produce(producer, out, on_delivery=on_delivery)
        except KafkaException as exc:
            raise translate(exc, where) from exc


def send_run(producer: Producer, run: Sequence[Processed], on_delivery: Report,
             topic: str, partition: int) -> None:
    """Queue a run of input records' outputs on a shared producer (the hot path: one
    call per partition per fetch); a failure raises naming its record
    (``where.offset``), the records before it queued."""
    send = producer.produce
    for record, outputs in run:
        for out in outputs:
            try:  # nothing built unless it fails
                send(out.topic, out.value, out.key, headers=out.headers,  # type: ignore[arg-type]
                     on_delivery=on_delivery)
            except BufferError:
                produce(producer, out, on_delivery=on_delivery)
            except KafkaException as exc:
                raise translate(exc, Where("produce", None, topic, partition,
                                           record.offset)) from exc

class PinnedProducer:
    """A transactional producer pinned to one input partition."""

    def __init__(self, config: Config, topic: str, partition: int, *, deadline_s: float,
                 on_error: Callable[[KafkaError], None] | None = None,
                 connect_first: bool = False) -> None:
        self.transactional_id = str(config["transactional.id"])
        self.topic, self.partition = topic, partition
        self.deadline_s = deadline_s
        self.connect_first = connect_first
        self.deliveries = DeliveryFailures()
        self.in_transaction = False  # begun, not yet committed or aborted
        self.closed = False
        self._close_lock = threading.Lock()
        self._fatal: KafkaError | None = None
        self._on_error = on_error
        # "delivery.report.only.error": success reports would cost a Python
        # call per output for nothing; commit_transaction flushes anyway.
        self._producer = Producer({**config, "delivery.report.only.error": True,
                                   "on_delivery": self.deliveries,
                                   "error_cb": self._record_error})

    def _record_error(self, error: KafkaError) -> None:
        """error_cb (librdkafka's thread or a poll): keep the fatal cause; never raise."""
        if error.fatal() and self._fatal is None:
            self._fatal = error
        if self._on_error is not None:
            self._on_error(error)

    def _where(self, op: str, offset: int | None = None) -> Where:
        return Where(op, self.transactional_id, self.topic, self.partition, offset)

    @contextmanager
    def _translated(self, op: str, offset: int | None = None) -> Iterator[None]:
        try:
            yield
        except KafkaException as exc:
            raise self._translate(exc, op, offset) from exc

    def _translate(self, exc: KafkaException, op: str,
                   offset: int | None = None) -> KafkaOperationError:
        """errors.translate, plus two librdkafka states that hide their cause:

        - once the producer is in a fatal state every call fails with a bare
          _FATAL; the cause (typically _FENCED) came through error_cb, use it;
        - once a delivery failed in the background the transaction is in an
          abortable state and ``produce`` fails with _STATE, unflagged: that is
          abortable (if the state is worse, the abort that follows says so).
        """
        where = self._where(op, offset)
        error = translate(exc, where)
        self._keep_fatal(exc)
        if not isinstance(error, FatalError):
            return error
        if error.code == KafkaError._STATE and op == "produce":
            return AbortableError(where, error.error)
        cause = self._fatal_cause() if error.code == KafkaError._FATAL else None
        return error if cause is None else classify(cause)(where, cause)

    def _keep_fatal(self, exc: KafkaException) -> None:
        """Remember a fatal error's cause the one time librdkafka tells it: from the
        poll that serves its event (confluent-kafka raises it there instead of calling
        error_cb), or from the call it failed. Every later call fails with a bare
        _FATAL and only this names the cause."""
        error = kafka_error(exc)
        if error is not None and error.fatal() and error.code() != KafkaError._FATAL \
                and self._fatal is None:
            self._fatal = error

    def _fatal_cause(self) -> KafkaError | None:
        """The cause of a bare _FATAL. librdkafka records the fatal error before it
        queues the event that tells it (rdkafka.c, ``rd_kafka_set_fatal_error0``:
        a log line lies between), so a call on another thread can fail with _FATAL
        while there is nothing to serve yet: wait for it, briefly. Without its cause a
        bare _FATAL is taken for fatal, and the replica exits 1 on what is only a
        fence (docs/decisions.md, "librdkafka hides two causes")."""
        deadline = time.monotonic() + _FATAL_CAUSE_WAIT_S
        while self._fatal is None and time.monotonic() < deadline:
            self._serve(0.01)
        return self._fatal

    def _serve(self, timeout: float) -> None:
        """poll(): delivery reports, logs and error events; keeps a fatal error's
        cause, never raises, and leaves a closed or closing producer alone."""
        if not self._close_lock.acquire(blocking=False):
            time.sleep(timeout)  # being closed on another thread: nothing to serve
            return
        try:
            if not self.closed:
                self._producer.poll(timeout)
        except KafkaException as exc:
            self._keep_fatal(exc)
            log.debug("producer.poll_failed", transactional_id=self.transactional_id,
                      error=str(exc))
        finally:
            self._close_lock.release()

    def _retrying(self, op: str, call: Callable[[float], T]) -> T:
        """Run ``call(timeout)``; retry it while librdkafka says the error is
        retriable, until ``deadline_s`` has passed.

        Every call gets the time left as its timeout: librdkafka's transactional
        calls wait forever by default, and its background operation retries for as
        long as the first call's timeout allows (without one, a
        send_offsets_to_transaction begun as the broker dies never returns). A call
        that timed out is resumed by calling it again; past the deadline the
        RetriableError reaches the caller."""
        deadline = time.monotonic() + self.deadline_s

        def attempt() -> T:
            with self._translated(op):
                return call(max(deadline - time.monotonic(), _MIN_CALL_S))

        def logged(exc: RetriableError) -> None:
            log.warning("kafka.retry", op=op, error=str(exc),
                        transactional_id=self.transactional_id)

        return retry_until(deadline, attempt, pause=_RETRY_PAUSE_S, on_retry=logged)

    def init(self) -> None:
        """init_transactions: fences any older producer with this id, finishes its txn.

        With ``connect_first``, two metadata requests for the pinned topic first. Why:
        a new producer's first FindCoordinator can go to its *bootstrap* broker, which
        librdkafka decommissions as soon as the first metadata names the real broker
        behind that address; the lookup then fails with ``_DESTROY_BROKER`` and is
        retried on the 500 ms coordinator query timer (rdkafka_txnmgr.c,
        ``rd_kafka_txn_coord_timer_start``): such a producer takes 0.5 s to
        initialise instead of a few tens of milliseconds. After one metadata round
        trip the bootstrap broker is gone, but the real one may not be connected yet:
        the lookup then finds "No brokers available for Transactions (2 broker(s)
        known)" and waits for the same timer. The second request waits for a
        connected broker (librdkafka's ``rd_kafka_broker_any_usable``), so the lookup
        has one. A failure is left to init_transactions to report. The backfill uses
        it (a new producer per slice), and so does the stage for a partition's first
        producer of an assignment, not for a replacement (ExactlyOnce.init): with it,
        a stage whose replacement producers initialise while its only broker freezes
        for 17 s can fail to finish init_transactions within the 90 s deadline and
        exit 1, whether the warm-up is bounded at 5 s or 1 s; why is not understood
        yet. Measurements: docs/journal/2026-11-26-warm-up.md."""
        if self.connect_first:
            try:
                for _ in range(2):
                    self._producer.list_topics(self.topic,
                                               timeout=min(self.deadline_s, _WARM_UP_S))
            except KafkaException as exc:
                log.debug("producer.warm_up_failed", transactional_id=self.transactional_id,
                          error=str(exc))
        self._retrying("init_transactions", self._producer.init_transactions)

    def take_failures(self) -> tuple[Failure, ...]:
        """Serve queued delivery reports, then hand over the failed outputs seen so far.
        Never raises: a fenced producer's poll() raises its fatal error again."""
        self.poll()
        return self.deliveries.take()

    def begin(self) -> None:
        self.deliveries.take()  # a failure of an earlier, aborted transaction is not ours
        with self._translated("begin_transaction"):
            self._producer.begin_transaction()
        self.in_transaction = True

    def produce(self, out: Produced, offset: int, *, partition: int | None = None) -> None:
        """Queue one output of the input record at ``offset`` (to ``partition`` if given,
        else where the partitioner puts it)."""
        if partition is None:
            self.produce_all([out], offset)
            return
        with self._translated("produce", offset):
            produce(self._producer, out, self.deliveries.for_record(offset), partition=partition)

    def produce_all(self, outputs: list[Produced], offset: int,
                    deliveries: DeliveryFailures | None = None) -> None:
        """Queue one input record's outputs; a failed one's report names ``offset``
        (delivery reports carry no headers), at the price of a callback object.
        ``deliveries``: where the failures go (SpanningProducer's, per partition)."""
        report = (deliveries or self.deliveries).for_record(offset)
        send = self._producer.produce
        for out in outputs:
            try:
                send(out.topic, out.value, out.key, headers=out.headers,  # type: ignore[arg-type]
                     on_delivery=report)
            except BufferError:
                with self._translated("produce", offset):
                    produce(self._producer, out, report)
            except KafkaException as exc:
                raise self._translate(exc, "produce", offset) from exc

    def produce_run(self, run: Sequence[Processed]) -> None:
        """Queue the outputs of a run of input records, naming none of them (the
        producer's own delivery callback: no object per record). A failure raises
        naming its record (``where.offset``); the records before it are queued.
        The hot path: one call per partition per fetch."""
        send = self._producer.produce
        for record, outputs in run:
            for out in outputs:
                try:
                    send(out.topic, out.value, out.key, headers=out.headers)  # type: ignore[arg-type]
                except BufferError:
                    with self._translated("produce", record.offset):
                        produce(self._producer, out)
                except KafkaException as exc:
                    raise self._translate(exc, "produce", record.offset) from exc

    def send_offsets(self, next_offset: int, group_metadata: object) -> None:
        offsets = [TopicPartition(self.topic, self.partition, next_offset)]
        self._retrying("send_offsets_to_transaction",
                       lambda timeout: self._producer.send_offsets_to_transaction(
                           offsets, group_metadata, timeout))

    def commit(self) -> None:
        """commit_transaction; a time-out is retried, never answered with an abort."""
        self._retrying("commit_transaction", self._producer.commit_transaction)
        self.in_transaction = False

    def abort(self) -> None:
        """abort_transaction; the failed outputs that made it necessary stay in
        ``deliveries`` (``take_failures``): they name the real cause."""
        try:
            self._retrying("abort_transaction", self._producer.abort_transaction)
        finally:
            self.in_transaction = False

    def poll(self) -> None:
        """Serve queued delivery reports, unless the producer is closed or closing;
        never raises. A fatal error served here is kept: the transaction's next call
        reports it, by its cause."""
        self._serve(0)

    def close(self) -> None:
        """Release the client; librdkafka aborts a transaction still open.

        Never commits: callers commit first when (and only when) that is right.
        """
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
            try:
                with warnings.catch_warnings():  # "abort failed during close": known, fenced
                    warnings.simplefilter("ignore", RuntimeWarning)
                    self._producer.close()
            except KafkaException as exc:  # a fenced producer says so again; nothing to do
                log.debug("producer.closed_after_error", transactional_id=self.transactional_id,
                          error=str(exc))

    def __repr__(self) -> str:
        return f"PinnedProducer({self.transactional_id!r})"


def close_quietly(producer: PinnedProducer | None) -> None:
    """Close ``producer`` (if any); a failure is logged, never raised: closing one must
    not stop the others from closing."""
    if producer is None:
        return
    try:
        producer.close()
    except Exception as exc:
        log.warning("producer.close_failed", transactional_id=producer.transactional_id,
                    error=str(exc))
