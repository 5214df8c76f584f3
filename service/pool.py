"""PinnedProducers: input partition → its task and transactional producer.

Producers are created and ``init_transactions()``-ed in parallel when partitions
are assigned (before they fetch), committed or aborted and closed in parallel
when they are revoked or lost. librdkafka releases the GIL in these calls, so a
small thread pool overlaps their round trips.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import structlog
from confluent_kafka import Producer

from service.errors import KafkaOperationError
from service.kafka_config import producer_config
from service.logs import error_cb, librdkafka_logger
from service.metrics import Metrics
from service.producer import DeliveryLatch, PinnedProducer, SharedWriter
from service.settings import Settings
from service.task import OpenTransaction, PartitionTask

log = structlog.get_logger(__name__)

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    task: PartitionTask
    committed: OpenTransaction | None
    error: KafkaOperationError | None
    seconds: float


class ProducerPool:
    """The pinned producers of the partitions this replica owns."""

    def __init__(self, settings: Settings, metrics: Metrics, workers: int = 16) -> None:
        self._settings = settings
        self._metrics = metrics
        self._tasks: dict[TopicPartitionKey, PartitionTask] = {}
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="txstage-pool")
        # init_transactions may wait out a dead owner's transaction: allow the
        # whole transaction timeout plus a margin before calling it fatal.
        self._deadline_s = settings.transaction_timeout_ms / 1000 + 30
        self._logger = librdkafka_logger("producer")
        self.deliveries = DeliveryLatch()
        self.shared: Producer | None = None
        if not settings.exactly_once:
            self.shared = Producer({
                **producer_config(settings, None), "logger": self._logger,
                "error_cb": error_cb("producer"), "delivery.report.only.error": True,
                "on_delivery": self.deliveries,
            })

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[PartitionTask]:
        return iter(list(self._tasks.values()))

    def get(self, key: TopicPartitionKey) -> PartitionTask | None:
        return self._tasks.get(key)

    def open(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Create and init a producer for each new partition, in parallel.

        Raises the first failure after every init has finished; the partitions
        that did initialise stay pinned.
        """
        new = [key for key in keys if key not in self._tasks]
        results = list(self._executor.map(self._create, new))
        errors = [result for result in results if isinstance(result, BaseException)]
        for result in results:
            if isinstance(result, PartitionTask):
                self._tasks[result.key] = result
        self._metrics.pinned_producers.set(len(self._tasks))
        if errors:
            raise errors[0]

    def _create(self, key: TopicPartitionKey) -> PartitionTask | BaseException:
        topic, partition = key
        if self.shared is not None:
            return PartitionTask(topic, partition, SharedWriter(self.shared, topic, partition))
        tid = self._settings.transactional_id(topic, partition)
        started = time.monotonic()
        try:
            config = {**producer_config(self._settings, tid), "logger": self._logger}
            producer = PinnedProducer(config, topic, partition, deadline_s=self._deadline_s,
                                      on_error=error_cb(tid))
            producer.init()
        except BaseException as exc:  # returned, raised on the loop thread by open()
            log.error("producer.init_failed", transactional_id=tid, error=str(exc))
            return exc
        seconds = time.monotonic() - started
        self._metrics.producer_init_seconds.observe(seconds)
        log.info("producer.ready", topic=topic, partition=partition, transactional_id=tid,
                 init_seconds=round(seconds, 4))
        return PartitionTask(topic, partition, producer)

    def replace(self, task: PartitionTask) -> PartitionTask:
        """A fresh, initialised producer for a partition whose producer was fenced."""
        self._drop(task)
        self.open([task.key])
        return self._tasks[task.key]

    def commit(self, tasks: list[PartitionTask], group_metadata: object) -> list[CommitOutcome]:
        """Commit the open transactions of ``tasks`` in parallel, and wait."""
        if len(tasks) == 1:
            return [_commit_one(tasks[0], group_metadata)]
        return list(self._executor.map(lambda t: _commit_one(t, group_metadata), tasks))

    def submit_commit(self, task: PartitionTask, group_metadata: object) -> Future[CommitOutcome]:
        """Start committing ``task``'s transaction on the pool; the loop goes on."""
        return self._executor.submit(_commit_one, task, group_metadata)

    def close(self, keys: Iterable[TopicPartitionKey],
              finish: Callable[[PartitionTask], None]) -> None:
        """Finish (commit or abort, as ``finish`` decides) and close these partitions."""
        tasks = [self._tasks[key] for key in keys if key in self._tasks]

        def one(task: PartitionTask) -> None:
            try:
                finish(task)
            finally:
                self._drop(task)

        list(self._executor.map(one, tasks))
        self._metrics.pinned_producers.set(len(self._tasks))

    def _drop(self, task: PartitionTask) -> None:
        self._tasks.pop(task.key, None)
        try:
            task.producer.close()
        except Exception as exc:  # closing must not stop the others from closing
            log.warning("producer.close_failed", transactional_id=task.transactional_id,
                        error=str(exc))

    def shutdown(self) -> None:
        """Wait for whatever runs on the pool, then flush the shared producer."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self.shared is not None:
            self.shared.flush(self._deadline_s)


def _commit_one(task: PartitionTask, group_metadata: object) -> CommitOutcome:
    started = time.monotonic()
    try:
        txn = task.commit(group_metadata)
    except KafkaOperationError as exc:
        return CommitOutcome(task, None, exc, time.monotonic() - started)
    return CommitOutcome(task, txn, None, time.monotonic() - started)
