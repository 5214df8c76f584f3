"""The whole group's lag, from the group's own committed offsets: what an autoscaler or
an alert should read, since it counts partitions no replica owns (a replica killed, and
its partitions waiting out the session time-out) as well as those owned.

A thread beside the loop asks the cluster every ``TXSTAGE_GROUP_LAG_INTERVAL_S`` for the
group's committed offsets and the input partitions' high watermarks, as the audit and
``kafka-consumer-groups.sh --describe`` read them, and exports

- ``txstage_group_lag{topic,partition}``: high watermark - committed offset (a
  partition with nothing committed: from where it would start, its log start or end)

Every replica exports every input partition, so any one that is alive says it all:
aggregate with ``max by (topic, partition)`` first, never ``sum`` across replicas
(docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import IsolationLevel
from confluent_kafka.admin import AdminClient
from prometheus_client import Gauge

from service.kafka.reading import EARLIEST, Config, OffsetReader, Partition, offsets
from service.observability.logs import librdkafka_logger
from service.observability.periodic import Periodic


def group_lag(ends: dict[Partition, int], committed: dict[Partition, int],
              starts: dict[Partition, int]) -> dict[Partition, int]:
    """Pure: each partition's lag; ``starts`` where nothing is committed (< 0)."""
    lag = {}
    for key, end in ends.items():
        offset = committed.get(key, -1)
        if offset < 0:
            offset = starts.get(key, end)
        lag[key] = max(end - offset, 0)
    return lag


class GroupLagWatch(Periodic):
    """The thread. ``starts_at_end``: a partition with nothing committed starts at the
    end of its log (auto.offset.reset latest), so nothing of it counts as lag."""

    def __init__(self, config: Config, group_id: str, topics: Sequence[str], gauge: Gauge, *,
                 interval_s: float, starts_at_end: bool) -> None:
        self._config, self._group_id = config, group_id
        self._topics = list(dict.fromkeys(topics))
        self._gauge = gauge
        self._starts_at_end = starts_at_end
        self._reader: OffsetReader | None = None
        self._admin: AdminClient | None = None
        super().__init__("group-lag", interval_s)

    def check(self) -> None:
        """One round: the offsets, then the gauge."""
        if self._reader is None:
            # Plain committed offsets (not RequireStable): a running exactly-once stage
            # holds a transaction's offsets most of the time, and the last committed
            # one is the group's position, as kafka-consumer-groups.sh shows it.
            self._reader = OffsetReader(self._config, self._group_id, stable=False)
            config: dict[str, Any] = {**self._config, "logger": librdkafka_logger("group-lag")}
            self._admin = AdminClient(config)
        assert self._admin is not None
        metadata = self._admin.list_topics(timeout=10)
        wanted = [(topic, p) for topic in self._topics if topic in metadata.topics
                  for p in metadata.topics[topic].partitions]
        ends = self._reader.end_offsets(wanted)
        committed = self._reader.committed(wanted, timeout_s=10)
        starts: dict[Partition, int] = {}
        missing = [key for key in wanted if committed.get(key, -1) < 0]
        if missing and not self._starts_at_end:
            starts = offsets(self._admin, missing, EARLIEST, IsolationLevel.READ_UNCOMMITTED,
                             timeout_s=10)
        for (topic, partition), lag in group_lag(ends, committed, starts).items():
            self._gauge.labels(topic, str(partition)).set(lag)
