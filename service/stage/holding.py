"""Records consumed and not processed yet, held by their partitions in input order:
while a commit or a lookup runs, or handed back at the poll-gap bound; bounded by
count and by bytes (the partition stops fetching), drained before anything fetched
later (docs/state-machine.md, "Time bounds the work")."""

from __future__ import annotations

import math
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from itertools import chain

from confluent_kafka import KafkaError, Message

from service.contract.records import Output, Transform
from service.kafka.cluster import OutputLimits
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage import machine as sm
from service.stage.guarantees.guarantee import Guarantee
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.positions import Positions
from service.stage.reports import Reporter
from service.stage.runner import Host
from service.stage.topic_lookups import TopicLookups
from service.stage.transform_watch import Marker


class Holding:
    """A runner's own state, and the records its partitions hold. ``host``: the loop
    (its configuration as it is now, and how it acts on a partition);
    ``partitions``: the loop's, read only; ``watch``: the record being transformed,
    for the transform watch (TXSTAGE_TRANSFORM_TIMEOUT_MS)."""

    def __init__(self, host: Host, settings: Settings, metrics: Metrics,
                 partitions: Mapping[TopicPartitionKey, Partition], positions: Positions,
                 reporter: Reporter, topics: TopicLookups, watch: Marker) -> None:
        self._host = host
        self.settings = settings
        self.metrics = metrics
        self.partitions = partitions
        self.positions = positions
        self.reporter = reporter
        self.topics = topics
        self.watch = watch
        self.held_bytes = 0  # the bytes every partition holds (_hold)
        self.yield_at = math.inf  # the poll-gap bound: processing hands back by then
        self.stopping = False  # the replica stops: the batch ends at the next record
        self._produced: Tally[str] = Tally()
        self._transform_seconds: Callable[[float], None] = metrics.transform_seconds.observe

    # The host's configuration, read as it is now.
    @property
    def committer(self) -> Guarantee:
        return self._host.committer

    @property
    def transform(self) -> Transform:
        return self._host.transform

    @property
    def limits(self) -> OutputLimits:
        return self._host.limits

    @property
    def policy(self) -> sm.Policy:
        return self._host.policy

    @property
    def health(self) -> Health:
        return self._host.health

    def dispatch(self, partition: Partition, event: sm.Event) -> None:
        self._host.dispatch(partition, event)

    def _consume_error(self, error: KafkaError, msg: Message) -> None:
        self._host.consume_error(error, msg)

    def bound(self, yield_at: float) -> None:
        self.yield_at = yield_at

    def stop(self) -> None:
        self.stopping = True

    def _hand_back(self, first: Message, rest: Iterator[Message],
                   saved: dict[int, list[Output]] | None) -> None:
        """The poll-gap bound ends the batch at ``first``: it and the rest are held by
        their partitions, in order (a record the partition would not process now, as
        ``_one`` decides, is dropped: it is read again after its seek), and are
        processed first once the loop has been back to consume()."""
        partitions = self.partitions
        for msg in chain((first,), rest):
            error = msg.error()
            if error is not None:
                self._consume_error(error, msg)
                continue
            partition = partitions.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
            if partition is None or self.positions.stale(partition, msg.offset()):  # type: ignore[arg-type]
                continue
            state = partition.state
            if state.holding or partition.held or (state.phase is sm.Phase.ACTIVE and not (
                    state.pauses and sm.Pause.BACKOFF in state.pauses)):
                self._hold(partition, msg, saved)
        self.metrics.poll_gap_yields.inc()

    def _hold(self, partition: Partition, msg: Message,
              saved: dict[int, list[Output]] | None = None) -> None:
        """Hold a record, in order, with what the transform already yielded for it
        (``saved``, when a held record is held again: it is not transformed twice).
        At the first limit reached (records or bytes held by the partition, or bytes
        held by the replica) the partition stops fetching until they are processed."""
        if saved:
            yielded = saved.pop(msg.offset(), None)  # type: ignore[arg-type]
            if yielded is not None:
                partition.saved[msg.offset()] = yielded  # type: ignore[index]
        held = partition.held
        if not held:
            partition.held_since = time.monotonic()
        held.append(msg)
        size = held_size(msg)
        partition.held_bytes += size
        self.held_bytes += size
        self._limit(partition, len(held))

    def _limit(self, partition: Partition, records: int) -> None:
        """Stop fetching the partition at the first limit its records reach (held, or
        out in workers: ``records`` of them)."""
        policy = self.policy
        if (records >= policy.backlog_limit
                or partition.held_bytes + partition.inflight_bytes
                >= policy.held_partition_max_bytes
                or self.held_bytes >= policy.held_max_bytes) \
                and sm.Pause.BACKLOG not in partition.state.pauses:
            self.dispatch(partition, sm.BacklogFull())

    def _unlimit(self, partition: Partition, records: int) -> None:
        """Fetch an active partition again once its records are below every limit."""
        state = partition.state
        policy = self.policy
        if state.pauses and sm.Pause.BACKLOG in state.pauses and state.phase is sm.Phase.ACTIVE \
                and records < policy.backlog_limit \
                and partition.held_bytes + partition.inflight_bytes \
                < policy.held_partition_max_bytes \
                and self.held_bytes < policy.held_max_bytes:
            self.dispatch(partition, sm.BacklogDrained())

    def discard(self, partition: Partition) -> None:
        """What the partition holds (or has out in workers) is stale (a seek, an
        abort, a release): forget it; its records are read again."""
        self._take_held(partition)
        partition.epoch += 1

    def process(self, messages: Iterator[Message] | list[Message], now: float,
                saved: dict[int, list[Output]] | None = None) -> None:
        raise NotImplementedError  # the runner's own

    def _take_held(self, partition: Partition) -> tuple[list[Message], dict[int, list[Output]]]:
        """The partition's held records and saved outputs, no longer counted as held."""
        held, partition.held = partition.held, []
        saved, partition.saved = partition.saved, {}
        self.held_bytes -= partition.held_bytes
        partition.held_bytes = 0
        return held, saved

    def drain(self, partition: Partition) -> None:
        """Process what the partition holds (before anything fetched later), as far as
        the poll-gap bound allows; the rest stays held, in order. Once below the
        limits, an active partition fetches again."""
        if partition.releasing or partition.state.holding:
            return  # (holding: it joined a spanning commit as it turned active)
        if partition.held and time.monotonic() < self.yield_at:
            held, saved = self._take_held(partition)
            self.process(held, time.monotonic(), saved)
        self._unlimit(partition, len(partition.held))


def held_size(msg: Message) -> int:
    """A held record's bytes: its key, value and headers."""
    size = len(msg.value() or b"") + len(msg.key() or b"")
    headers: list[tuple[str, bytes | None]] | None = msg.headers()  # type: ignore[assignment]
    if headers:
        for name, value in headers:
            size += len(name) + len(value or b"")
    return size
