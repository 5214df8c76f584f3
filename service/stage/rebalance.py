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
        self.abandoning = False  # the group is being left: everything was released (or given up)

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
        """Release partitions: a rebalance's revoke or loss, or the stage's own stop
        (``reason="shutdown"``; ``lost``: the stop is dirty, commit nothing).

        A stop is logged once, as ``partitions.released``, and is no rebalance. The
        revoke that ``consumer.close()`` then calls back (``abandoning``) finds
        nothing pinned: it is logged at debug and not counted."""
        if self.abandoning:
            log.debug("partitions.released_at_close", partitions=_names(partitions),
                      reason=reason)
            return
        keys = [(tp.topic, tp.partition) for tp in partitions]
        if deadline is None:  # lost: nothing in flight can still commit, so wait for none
            deadline = time.monotonic() + (0.0 if lost else self._release_s)
        if reason != "shutdown":
            self._metrics.rebalances.labels(kind="lost" if lost else "revoked").inc()
        try:
            self._loop.release(keys, lost=lost, reason=reason, deadline=deadline)
        except BaseException as exc:
            self._loop.record(exc, "rebalance")
        if reason == "shutdown":
            log.info("partitions.released", partitions=_names(partitions),
                     outcome="aborted" if lost else "committed", pinned=len(self._loop.partitions))
        else:
            log.info(f"partitions.{reason}", partitions=_names(partitions),
                     pinned=len(self._loop.partitions))


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{tp.topic}/{tp.partition}" for tp in partitions]
