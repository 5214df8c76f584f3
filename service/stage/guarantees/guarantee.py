"""The guarantee interface: what the loop needs from exactly-once and at-least-once
alike. The loop never asks which one it has.

A call that may wait on Kafka returns a ``Job`` (run beside the loop, its event
dispatched when it ends); a call the committer can finish at once returns the
event itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from service.contract.processing import Processed, Produced
from service.stage.machine import Event, Txn
from service.stage.partition import TopicPartitionKey

Job = Callable[[], Event | None]
GroupMetadata = Callable[[], object]


@dataclass(frozen=True)
class ReleaseReport:
    """What a release's own commit or abort found, as its job's result: the loop
    hands it to its reporter, which counts it, as it counts the state machine's
    reports. One of the three is set."""

    committed_s: float | None = None  # committed, taking this long
    records: int = 0                  # the committed transaction's input records
    aborted: str | None = None        # aborted, for this reason
    fenced: bool | None = None        # fenced; whether a transaction was open


ReleaseJob = Callable[[], ReleaseReport | None]


def group_metadata_of(consumer: _HasGroupMetadata) -> GroupMetadata:
    """The consumer's group metadata, for a committer to take as its commit starts,
    on the loop thread (``Guarantee.commit``): the consumer must not be called from
    another thread (its calls there wait while the loop sits in consume()).
    At-least-once never takes it: it costs 0.1-0.3 ms a commit
    (docs/journal/2026-11-27-at-least-once-linger-20ms.md)."""
    return lambda: consumer.consumer_group_metadata()  # noqa: PLW0108 (looked up per commit)


class _HasGroupMetadata(Protocol):
    def consumer_group_metadata(self) -> object: ...


class Guarantee(Protocol):
    """One delivery guarantee, as the loop drives it."""

    def init(self, key: TopicPartitionKey, replacing: bool = False) -> Job:
        """Make the partition's producer ready (exactly-once: init_transactions);
        ``replacing`` one given up after trouble (see state.StartInit)."""

    def write(self, key: TopicPartitionKey, offset: int, outputs: list[Produced]) -> None:
        """Queue one input record's outputs; raises KafkaOperationError. A failed
        output's report names ``offset``: a record whose partition is not flowing
        (isolating, replaying held records) is written one at a time, named."""

    def write_run(self, key: TopicPartitionKey, run: list[Processed]) -> None:
        """Queue a flowing partition's run of records (in offset order, from one
        fetch), naming none: a refusal nobody names is found by bisection in
        exactly-once, and in at-least-once by writing the records up to the failed
        ones again, named (state.DeliveryFailed). A callback object per record costs
        more than the rest of a write. Raises KafkaOperationError naming the record
        that failed (``where.offset``); the records before it are written."""

    def commit(self, key: TopicPartitionKey, txn: Txn,
               group_metadata: GroupMetadata) -> Job | Event:
        """Make ``txn`` durable: outputs and input position. ``group_metadata`` takes
        the consumer's group metadata: call it here, on the loop thread, if at all,
        never in the job (the consumer is the loop thread's)."""

    def abort(self, key: TopicPartitionKey, txn: Txn | None) -> Job | Event:
        """Give up the open transaction; its input is read again from Kafka's offset."""

    def finish(self, key: TopicPartitionKey, txn: Txn | None, commit: bool, reason: str,
               group_metadata: GroupMetadata,
               deadline: float | None = None) -> ReleaseJob | None:
        """Released: commit (falling back to an abort) or abort, then close; a job,
        or None when it was done at once (on the loop thread). ``group_metadata``: as
        for ``commit``. What it does on the loop thread waits for nothing past
        ``deadline`` (monotonic; the loop waits for a job only until then)."""

    def detach(self, key: TopicPartitionKey) -> Job:
        """Take the partition's producer out of use now (a new incarnation of the
        partition gets its own); the job closes it without committing anything."""

    def poll(self, now: float) -> list[tuple[TopicPartitionKey, Event]]:
        """Serve delivery reports; events for partitions whose outputs failed."""

    def transactional_id(self, key: TopicPartitionKey) -> str | None: ...

    def shutdown(self, timeout_s: float) -> None:
        """Close whatever is left; wait at most ``timeout_s``."""
