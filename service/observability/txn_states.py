"""The transaction state of this replica's own producers, from librdkafka's statistics
(``statistics.interval.ms``; the ``eos`` object's ``txn_state``).

The age is measured here, from the reports: since the first report of the current state
(so to within one statistics interval). librdkafka's own ``txn_stateage`` cannot be
used: STATISTICS.md calls it the time since the last ``txn_state`` change in
milliseconds, but the bundled librdkafka never resets it — measured here, it is the
monotonic clock since boot in ms, through Init → Ready → InTransaction → Ready alike
(``idemp_stateage`` does reset).

``txstage_producer_transaction_state_seconds{state}``: per librdkafka transaction state
(Ready, InTransaction, BeginCommit, AbortingTransaction, ...), how long the producer
longest in that state has been in it. A producer stuck in BeginCommit or
AbortingTransaction, or InTransaction past the transaction timeout, shows here before
anything else notices. Bounded labels: the states are a fixed set of librdkafka's.

The statistics callback runs inside a poll or flush of the producer: it only parses
and records (never raises); collection happens at scrape time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

NAME = "txstage_producer_transaction_state_seconds"


class TransactionStates:
    """A Prometheus collector fed by each pinned producer's ``stats_cb``; a producer
    counts from its ``callback`` until ``forget`` (when the stage lets it go). Reports
    arrive only while the producer is polled (its transactions' calls serve them): an
    idle producer keeps its last state, ageing."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._latest: dict[str, tuple[str, float]] = {}  # tid: state, since
        self._current: dict[str, object] = {}  # tid: the token of its live producer
        self._lock = threading.Lock()
        self._clock = clock

    def callback(self, transactional_id: str) -> Callable[[str], None]:
        token = object()
        with self._lock:
            self._current[transactional_id] = token
            self._latest.pop(transactional_id, None)

        def record(stats: str) -> None:
            try:
                state = str((json.loads(stats).get("eos") or {})["txn_state"])
            except (ValueError, KeyError, TypeError, AttributeError):
                return
            now = self._clock()
            with self._lock:
                if self._current.get(transactional_id) is not token:
                    return  # a producer let go (or replaced) reporting late
                previous = self._latest.get(transactional_id)
                since = previous[1] if previous is not None and previous[0] == state else now
                self._latest[transactional_id] = (state, since)
        return record

    def forget(self, transactional_id: str) -> None:
        with self._lock:
            self._current.pop(transactional_id, None)
            self._latest.pop(transactional_id, None)

    def ages(self) -> dict[str, float]:
        """Per state, the longest a current producer has been in it (seconds)."""
        now = self._clock()
        longest: dict[str, float] = {}
        with self._lock:
            for state, since in self._latest.values():
                longest[state] = max(longest.get(state, 0.0), now - since)
        return longest

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(NAME, "Per librdkafka transaction state, how long this "
                                         "replica's producer longest in it has been in it",
                                   labels=["state"])
        for state, age in sorted(self.ages().items()):
            family.add_metric([state], age)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(NAME, "", labels=["state"])
