"""Failed deliveries: what a delivery report says about one output, and which input
record it came from. Shared by both committers and the state
machine, so a refused output is traced to its record the same way in either mode."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from confluent_kafka import KafkaError, Message

# Answers that refuse a record itself: sending it again cannot help.
# _INVALID_DIFFERENT_RECORD marks the innocent neighbours of a refused record in
# the same batch (librdkafka reads the broker's per-record errors), so it is not one.
# An output topic deleted while the stage runs is refused too (the producer's
# _UNKNOWN_TOPIC at produce(), UNKNOWN_TOPIC_OR_PART in a delivery report once its
# retries ran out): the record is sent once more, then dead-lettered.
UNKNOWN_TOPICS = frozenset({KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART})
# Answers after which the stage looks its output topics up again. A topic deleted
# just before a producer first asks for it is not refused at once: librdkafka waits
# topic.metadata.propagation.max.ms (30 s) before it believes the topic is gone,
# and a transaction time-out below that times the outputs out instead, every replay.
LOOK_AGAIN = UNKNOWN_TOPICS | {KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT}
REFUSALS = frozenset({
    KafkaError.INVALID_RECORD, KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_TIMESTAMP, KafkaError.POLICY_VIOLATION, *UNKNOWN_TOPICS,
})
# Outputs an abort purged: a consequence of the failure, never its cause.
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
_KEEP_AT_MOST = 1000


@dataclass(frozen=True, slots=True)
class Failure:
    """One output that was not delivered."""

    code: int
    name: str
    message: str
    offset: int | None  # the input offset its lineage names, when it names one

    @property
    def refusal(self) -> bool:
        return self.code in REFUSALS


class DeliveryFailures:
    """An ``on_delivery`` callback that keeps every failed output except purges.

    librdkafka callbacks must never raise (a raised callback replaces the error of
    the call that served it), so this only records; the owner takes the list."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: list[Failure] = []

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        self.record(None, error, message)

    def for_record(self, offset: int) -> Callable[[KafkaError | None, Message], None]:
        """A per-message callback naming the input record (delivery reports carry no
        headers, so lineage cannot name it afterwards). One per input record."""
        return partial(self.record, offset)

    def record(self, offset: int | None, error: KafkaError | None, message: Message) -> None:
        if error is None or error.code() in _PURGED:
            return
        failure = Failure(error.code(), error.name(), error.str(), offset)
        with self._lock:
            if len(self._failures) < _KEEP_AT_MOST:
                self._failures.append(failure)

    def take(self) -> tuple[Failure, ...]:
        with self._lock:
            failures, self._failures = tuple(self._failures), []
        return failures
