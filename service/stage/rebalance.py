"""The rebalance listener. librdkafka calls it inside ``consume()`` on the loop
thread; it never raises (errors are recorded and raised by the loop after
``consume()`` returns) and never starts work that outlives its deadline."""

from __future__ import annotations

import time

import structlog
from confluent_kafka import Consumer, TopicPartition

from service.observability.health import Health
from service.observability.metrics import Metrics
from service.stage.loop import Loop

log = structlog.get_logger(__name__)


class RebalanceListener:
    def __init__(self, loop: Loop, metrics: Metrics, health: Health, release_s: float) -> None:
        self._loop = loop
        self._metrics = metrics
        self._health = health
        self._release_s = release_s
        self.abandoning = False  # the shutdown budget ran out: release nothing, just go

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Assign, then pause at once: each partition fetches only after its producer
        is initialised (fencing any older owner) and its position is read from Kafka."""
        self._metrics.rebalances.labels(kind="assigned").inc()
        try:
            consumer.incremental_assign(partitions)
            self._loop.assign(partitions)
        except BaseException as exc:
            self._loop.record(exc, "rebalance")
        self._health.joined(True)
        log.info("partitions.assigned", partitions=_names(partitions),
                 pinned=len(self._loop.partitions))

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.release(partitions, lost=False, reason="revoked")

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.release(partitions, lost=True, reason="lost")

    def release(self, partitions: list[TopicPartition], *, lost: bool, reason: str,
                deadline: float | None = None) -> None:
        kind = "lost" if lost else "revoked"
        self._metrics.rebalances.labels(kind=kind).inc()
        keys = [(tp.topic, tp.partition) for tp in partitions]
        if deadline is None:  # lost: nothing in flight can still commit, so wait for none
            deadline = time.monotonic() + (0.0 if lost else self._release_s)
        if not self.abandoning:
            try:
                self._loop.release(keys, lost=lost, reason=reason, deadline=deadline)
            except BaseException as exc:
                self._loop.record(exc, "rebalance")
        log.info(f"partitions.{kind}", partitions=_names(partitions),
                 pinned=len(self._loop.partitions))


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{tp.topic}/{tp.partition}" for tp in partitions]
