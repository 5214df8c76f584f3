"""Records consumed and not processed yet, held by their partitions in input order:
while a commit or a lookup runs, or handed back at the poll-gap bound; bounded by
count and by bytes (the partition stops fetching), drained before anything fetched
later (docs/state-machine.md, "Time bounds the work")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import chain

from confluent_kafka import Message

from service.contract.records import Output
from service.stage import machine as sm
from service.stage.loop_state import LoopState
from service.stage.partition import Partition


class Holding(LoopState):
    """The held records of :class:`Loop`'s partitions."""

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

    def _take_held(self, partition: Partition) -> tuple[list[Message], dict[int, list[Output]]]:
        """The partition's held records and saved outputs, no longer counted as held."""
        held, partition.held = partition.held, []
        saved, partition.saved = partition.saved, {}
        self.held_bytes -= partition.held_bytes
        partition.held_bytes = 0
        return held, saved

    def _drain(self, partition: Partition) -> None:
        """Process what the partition holds (before anything fetched later), as far as
        the poll-gap bound allows; the rest stays held, in order. Once below the
        limits, an active partition fetches again."""
        if partition.releasing:
            return
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
