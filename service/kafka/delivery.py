"""Failed deliveries: what a delivery report says about one output, and which input
record it came from. Shared by both committers and the state
machine, so a refused output is traced to its record the same way in either mode."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

from confluent_kafka import KafkaError, Message

from service.errors import Failure

# Outputs an abort purged: a consequence of the failure, never its cause.
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
_KEEP_AT_MOST = 1000


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
