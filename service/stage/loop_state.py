"""What the parts of :class:`~service.stage.loop.Loop` share: the objects the loop
holds (set in ``Loop.__init__``) and the calls one part makes on another. The parts
(batch, positions, reports, housekeeping) are mixins over one object, so a call
between them is a plain method call on the hot path."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, Message

from service.contract.records import Output, Transform
from service.kafka.cluster import OutputLimits
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage import machine as sm
from service.stage.fetch_watch import FetchWatch
from service.stage.guarantees.guarantee import Guarantee
from service.stage.jobs import Jobs
from service.stage.overruns import OverrunBook
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.positions import Positions
from service.stage.reports import Reporter
from service.stage.topic_lookups import TopicLookups
from service.stage.transform_watch import Marker
from service.stage.workers import WorkerPool


class LoopState:
    """The loop's fields, declared once for every part."""

    settings: Settings
    transform: Transform
    metrics: Metrics
    health: Health
    limits: OutputLimits
    consumer: Consumer
    committer: Guarantee
    policy: sm.Policy
    jobs: Jobs
    partitions: dict[TopicPartitionKey, Partition]
    recorded: list[BaseException]
    _produced: Tally[str]
    _transform_seconds: Callable[[float], None]
    fetch_watch: FetchWatch
    stopping: bool
    polled_at: float
    yield_at: float
    held_bytes: int
    inflight_records: int
    pool: WorkerPool | None
    watch: Marker                  # the record being transformed (TransformWatch reads it)
    overruns: OverrunBook | None   # transform calls that overran (None: no time-out)
    reporter: Reporter
    positions: Positions
    topics: TopicLookups

    # Calls between parts: each is defined by the part named beside it.
    def dispatch(self, partition: Partition, event: sm.Event) -> None:  # loop
        raise NotImplementedError

    def _consume_error(self, error: KafkaError, msg: Message) -> None:  # loop
        raise NotImplementedError


    def _take_held(self, partition: Partition) -> tuple[list[Message],  # batch
                                                         dict[int, list[Output]]]:
        raise NotImplementedError

    def process(self, messages: Iterable[Message], now: float,  # batch
                saved: dict[int, list[Output]] | None = None) -> None:
        raise NotImplementedError


    def _limit(self, partition: Partition, records: int) -> None:  # batch
        raise NotImplementedError

    def _unlimit(self, partition: Partition, records: int) -> None:  # batch
        raise NotImplementedError

    def _discard(self, partition: Partition) -> None:  # offload
        raise NotImplementedError

