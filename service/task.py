"""PartitionTask: the state of one assigned input partition and its transaction."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import Message

from service import transaction
from service.processing import Produced
from service.producer import PinnedProducer

if TYPE_CHECKING:
    from service.pool import CommitOutcome


class Writer(Protocol):
    """What a task writes through: a PinnedProducer, or in at-least-once mode a
    SharedWriter."""

    transactional_id: str
    closed: bool

    def begin(self) -> None: ...
    def produce(self, out: Produced, offset: int) -> None: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class OpenTransaction:
    first_offset: int  # where to rewind when it aborts
    next_offset: int   # what to commit: last processed offset + 1
    records: int
    opened_at: float   # time.monotonic()


class PartitionTask:
    """One input partition: its pinned producer and at most one open transaction.

    Not thread-safe by design: the loop thread calls everything except
    ``commit``, which a pool thread may run while the loop thread waits.
    """

    def __init__(self, topic: str, partition: int, producer: Writer) -> None:
        self.topic, self.partition = topic, partition
        self.producer = producer
        self.txn: OpenTransaction | None = None
        self.position: int | None = None  # next input offset to process
        self.poison_offset: int | None = None  # the record the transform keeps failing on
        self.poison_attempts = 0       # failed attempts at poison_offset
        self.abort_streak = 0          # aborts since the last commit
        self.commit_now = False        # commit at the end of this batch, due or not
        self.commit_uncertain = False  # a commit timed out: it may have succeeded
        self.committing: Future[CommitOutcome] | None = None  # commit running on the pool
        self.backlog: list[Message] = []  # records that arrived while committing, in order
        self.paused_for_backlog = False
        # After the broker refused an output: one record per transaction below
        # isolate_until, to find the record; refused: offset -> what the broker said.
        self.isolate_until: int | None = None
        self.refused: dict[int, str] = {}
        self.discard_batch = False     # rewound: drop the rest of this consume batch
        self.fenced_at: float | None = None  # monotonic time the producer was fenced
        self.resume_at: float | None = None  # paused for backoff until then

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def transactional_id(self) -> str:
        return self.producer.transactional_id

    def write(self, offset: int, outputs: list[Produced]) -> None:
        """Add one input record's outputs to the open transaction (opening one if needed)."""
        txn = self.txn
        if txn is None:
            self.producer.begin()
            txn = self.txn = OpenTransaction(offset, offset + 1, 0, time.monotonic())
        for out in outputs:
            self.producer.produce(out, offset)
        txn.next_offset = self.position = offset + 1
        txn.records += 1

    def due(self, now: float, interval_s: float, max_records: int) -> bool:
        txn = self.txn
        return txn is not None and (now - txn.opened_at >= interval_s
                                    or txn.records >= max_records)

    def commit(self, group_metadata: object) -> OpenTransaction:
        """Commit the open transaction; returns what it held. See transaction.commit."""
        txn = self.txn
        assert txn is not None, "commit without an open transaction"
        assert isinstance(self.producer, PinnedProducer), "only pinned producers commit"
        transaction.commit(self.producer, txn.next_offset, group_metadata)
        self.txn = None
        self.abort_streak = 0
        return txn

    def abort(self) -> int | None:
        """Abort the open transaction, if any; returns the offset to rewind to."""
        txn, self.txn = self.txn, None
        if txn is None:
            return None
        self.producer.abort()
        return txn.first_offset

    def delivered(self) -> OpenTransaction:
        """At-least-once: the outputs are delivered; close the batch, return it."""
        txn, self.txn = self.txn, None
        assert txn is not None, "no open batch"
        return txn

    def forget(self) -> int | None:
        """Drop the open transaction without touching the (fenced or dead) producer."""
        txn, self.txn = self.txn, None
        return None if txn is None else txn.first_offset

    def age(self, now: float) -> float:
        return 0.0 if self.txn is None else now - self.txn.opened_at
