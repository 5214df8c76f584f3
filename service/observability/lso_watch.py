"""How far each partition's last stable offset (LSO) lags its high watermark, and for
how long it has not moved: an open transaction holds the LSO back, and every
read_committed reader of the partition (this stage's consumers, downstream ones)
stops there. A transaction the coordinator never finishes (a *hanging* transaction,
KIP-664) holds it forever.

A thread beside the loop asks the cluster every ``TXSTAGE_LSO_CHECK_INTERVAL_S`` for the
LSO (ListOffsets, read_committed) and the high watermark of every partition of the
input, output and dead-letter topics and exports

- ``txstage_lso_lag_records{role,topic,partition}``: high watermark - LSO
- ``txstage_lso_stuck_seconds{role,topic,partition}``: how long the LSO has stayed at
  its value while below the high watermark (0 when it is at the high watermark)

Alert TxstageLastStableOffsetStuck and the runbook: docs/operations.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from prometheus_client import Gauge

from service.observability.logs import librdkafka_logger
from service.observability.periodic import Periodic

Key = tuple[str, str, int]  # role, topic, partition
_LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]


@dataclass
class LsoTracker:
    """Pure: from successive (LSO, high watermark) samples, the lag and the time the LSO
    has been stuck below the high watermark."""

    since: dict[Key, tuple[int, float]] = field(default_factory=dict)  # LSO, when first seen

    def observe(self, key: Key, lso: int, high: int, now: float) -> tuple[int, float]:
        if lso >= high:
            self.since.pop(key, None)
            return 0, 0.0
        previous = self.since.get(key)
        if previous is None or previous[0] != lso:
            self.since[key] = (lso, now)
            return high - lso, 0.0
        return high - lso, now - previous[1]


class LsoWatch(Periodic):
    """The thread; ``topics`` maps a role (input, output) to topic names."""

    def __init__(self, admin_config: Mapping[str, Any], topics: Mapping[str, Sequence[str]],
                 lag: Gauge, stuck: Gauge, *, interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        config: dict[str, Any] = {**admin_config, "logger": librdkafka_logger("lso-watch")}
        self._admin = AdminClient(config)
        self._topics = {role: list(dict.fromkeys(names)) for role, names in topics.items()}
        self._lag, self._stuck = lag, stuck
        self._clock = clock
        self._tracker = LsoTracker()
        super().__init__("lso-watch", interval_s)

    def check(self) -> None:
        """One round: list the offsets, update the gauges."""
        metadata = self._admin.list_topics(timeout=10)
        partitions = [(role, topic, p) for role, names in self._topics.items()
                      for topic in names if topic in metadata.topics
                      for p in metadata.topics[topic].partitions]
        lso = self._list(partitions, IsolationLevel.READ_COMMITTED)
        high = self._list(partitions, IsolationLevel.READ_UNCOMMITTED)
        now = self._clock()
        for key in partitions:
            if key in lso and key in high:
                lag, stuck = self._tracker.observe(key, lso[key], high[key], now)
                labels = (key[0], key[1], str(key[2]))
                self._lag.labels(*labels).set(lag)
                self._stuck.labels(*labels).set(stuck)

    def _list(self, partitions: list[Key], isolation: IsolationLevel) -> dict[Key, int]:
        if not partitions:
            return {}
        roles = {(topic, p): role for role, topic, p in partitions}
        request = {TopicPartition(t, p): _LATEST for _, t, p in partitions}
        futures = self._admin.list_offsets(request, isolation_level=isolation,
                                           request_timeout=10)
        found = {(roles[(tp.topic, tp.partition)], tp.topic, tp.partition): f.result(30).offset
                 for tp, f in futures.items()}
        # -1001 and no error: librdkafka's answer for a partition whose leader is not
        # known yet. Left out: the partition is observed at the next round.
        return {key: offset for key, offset in found.items() if offset >= 0}
