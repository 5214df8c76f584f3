"""``TXSTAGE_WORKERS=N``: consumed records go to worker processes a chunk per partition,
and come back, in each partition's input order, as what the transform yielded; they
are then processed as any batch is (``Batch.process``), from those results, so
dead letters, lineage, size checks, commits, holds and the clock behave exactly as
in-process. A record's results are never produced before every record consumed
before it in its partition; a chunk whose partition was sought back, aborted or
released meanwhile (its epoch moved) is dropped, and its records are read again."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Message

from service.contract.records import Output
from service.stage import machine as sm
from service.stage.holding import held_size
from service.stage.loop_state import LoopState
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.workers.wire import WireRecord, replay, wire_record


class Offload(LoopState):
    """The part of :class:`Loop` that runs the transform in ``pool``."""

    def _submit(self, messages: Iterable[Message]) -> None:
        """Each partition's records of the batch, in order, as one chunk to the pool.
        An error in the batch (an end of partition, say) is handled where it stands:
        the records before it are sent first, as ``Batch.process`` would have
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
        assert pool is not None
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
        assert pool is not None
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

    def _discard(self, partition: Partition) -> None:
        """What the partition holds or has out in workers is stale (a seek, an abort,
        a release): forget it; its records are read again."""
        self._take_held(partition)
        partition.epoch += 1
        if self.pool is not None:
            for chunk in self.pool.discard(partition.key):
                partition.inflight_bytes -= chunk.size
                partition.inflight -= len(chunk.messages)
                self.inflight_records -= len(chunk.messages)


_RUNNING = (sm.Phase.ACTIVE, sm.Phase.COMMITTING)
