"""``TXSTAGE_WORKERS=N``: consumed records go to worker processes a chunk per partition,
and come back, in each partition's input order, as what the transform yielded; they
are then processed as any batch is (``InProcess.process``), from those results, so
dead letters, lineage, size checks, commits, holds and the clock behave exactly as
in-process. A record's results are never produced before every record consumed
before it in its partition; a chunk whose partition was sought back, aborted or
released meanwhile (its epoch moved) is dropped, and its records are read again."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Message

from service.contract.records import Output
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage import machine as sm
from service.stage.holding import held_size
from service.stage.in_process import InProcess
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.positions import Positions
from service.stage.reports import Reporter
from service.stage.runner import Host
from service.stage.topic_lookups import TopicLookups
from service.stage.transform_watch import Marker
from service.stage.workers import WorkerPool
from service.stage.workers.wire import WireRecord, replay, wire_record


class OnWorkers(InProcess):
    """A runner: the transform runs in ``pool``'s worker processes; what they yield
    is replayed through the in-process runner's per-record path."""

    _replays = True

    def __init__(self, host: Host, settings: Settings, metrics: Metrics,
                 partitions: Mapping[TopicPartitionKey, Partition], positions: Positions,
                 reporter: Reporter, topics: TopicLookups, watch: Marker,
                 pool: WorkerPool) -> None:
        super().__init__(host, settings, metrics, partitions, positions, reporter, topics,
                         watch)
        self.pool = pool
        self.inflight_records = 0
        # The main process only replays what the workers yielded: their own timings
        # are observed instead (_complete).
        self._transform_seconds = _unobserved

    def run(self, messages: Iterable[Message], now: float, wait_s: float) -> None:
        pool = self.pool
        if messages:
            self._submit(messages)
        pool.serve(0 if messages or not pool.in_flight else wait_s)
        self._complete(time.monotonic())

    def waiting(self) -> bool:
        return bool(self.pool.in_flight)

    def _submit(self, messages: Iterable[Message]) -> None:
        """Each partition's records of the batch, in order, as one chunk to the pool.
        An error in the batch (an end of partition, say) is handled where it stands:
        the records before it are sent first, as ``InProcess.process`` would have
        processed them first (an end can seek the partition, and records before it
        must then count as out, not be sent after the seek)."""
        partitions = self.partitions
        chunks: dict[TopicPartitionKey, tuple[list[Message], list[WireRecord]]] = {}
        for msg in messages:
            error = msg.error()
            if error is not None:
                self._send_chunks(chunks)
                self._consume_error(error, msg)
                continue
            key = (msg.topic(), msg.partition())
            partition = partitions.get(key)  # type: ignore[arg-type]
            if partition is None or self.positions.stale(partition, msg.offset()):  # type: ignore[arg-type]
                continue
            state = partition.state
            if state.phase not in _RUNNING or (state.pauses and sm.Pause.BACKOFF in state.pauses):
                continue  # fetched before a seek or a pause: read again later
            chunk = chunks.get(key)  # type: ignore[arg-type]
            if chunk is None:
                chunk = chunks[key] = ([], [])  # type: ignore[index]
            chunk[0].append(msg)
            chunk[1].append(wire_record(msg))
        self._send_chunks(chunks)

    def _send_chunks(self, chunks: dict[TopicPartitionKey,
                                        tuple[list[Message], list[WireRecord]]]) -> None:
        pool = self.pool
        for key, (msgs, records) in chunks.items():
            partition = self.partitions[key]
            size = sum(map(held_size, msgs))
            pool.submit(key, partition, partition.epoch, msgs, records, size)
            partition.inflight_bytes += size
            partition.inflight += len(msgs)
            partition.inflight_next = records[-1][2] + 1
            self.inflight_records += len(msgs)
            self._limit(partition, len(partition.held) + len(msgs))
        chunks.clear()

    def _complete(self, now: float) -> None:
        """Process the chunks whose results are in, each partition in input order."""
        pool = self.pool
        observe = self.metrics.transform_seconds.observe
        for chunk in pool.completed():
            partition: Partition = chunk.owner  # type: ignore[assignment]
            partition.inflight_bytes -= chunk.size
            partition.inflight -= len(chunk.messages)
            self.inflight_records -= len(chunk.messages)
            if self.partitions.get(chunk.key) is not partition or \
                    partition.epoch != chunk.epoch or chunk.results is None:
                continue
            saved: dict[int, list[Output]] = {}
            for record, result in zip(chunk.records, chunk.results, strict=True):
                saved[record[2]] = replay(result)
                observe(result[2])
            self.process(chunk.messages, now, saved)
            self._unlimit(partition, len(partition.held))

    def discard(self, partition: Partition) -> None:
        super().discard(partition)
        for chunk in self.pool.discard(partition.key):
            partition.inflight_bytes -= chunk.size
            partition.inflight -= len(chunk.messages)
            self.inflight_records -= len(chunk.messages)


_RUNNING = (sm.Phase.ACTIVE, sm.Phase.COMMITTING)


def _unobserved(seconds: float) -> None:
    pass
