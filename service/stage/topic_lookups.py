"""Output topics (or schemas) a record waits for: looked up beside the loop, one
lookup per topic however many partitions wait for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future

from service.kafka.cluster import OutputLimits
from service.stage.jobs import Jobs
from service.stage.partition import Partition


class TopicLookups:
    """The topic-limits lookups in flight, and the ones a record asked for."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs
        self._running: dict[str, Future[object]] = {}
        self._asked: dict[str, Callable[[], object]] = {}  # TopicLimitPending.lookup

    def ask(self, topic: str, lookup: Callable[[], object]) -> None:
        """What to run to know ``topic`` when it is looked up (not a topic: the schema
        registry, for formats) instead of the cluster's topic limits."""
        self._asked[topic] = lookup

    def start(self, partition: Partition, topic: str, limits: OutputLimits) -> None:
        """``partition`` waits for ``topic``: look it up, unless that runs already."""
        partition.waiting_topic = topic
        if topic not in self._running:
            lookup = self._asked.pop(topic, None) or (lambda: limits.resolve(topic))
            self._running[topic] = self._jobs.submit(lookup)

    def resolved(self) -> Iterator[str]:
        """The topics whose lookups have ended since last asked."""
        for topic, future in list(self._running.items()):
            if future.done():
                del self._running[topic]
                yield topic
