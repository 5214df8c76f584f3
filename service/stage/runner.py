"""The seam where a run of consumed records becomes results: a :class:`Runner`.

The loop hands a runner each consumed batch (``run``); the runner brings every
partition's records, in offset order, through ``contract.processing.process`` and
writes their results to the guarantee, looking at the clock between records
(docs/state-machine.md, "Time bounds the work"). Two runners keep one contract
(docs/architecture.md, "A runner's contract"): ``InProcess`` (the transform in the
loop's thread) and ``OnWorkers`` (TXSTAGE_WORKERS: worker processes run it, and
their results are replayed through the same per-record path)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from confluent_kafka import KafkaError, Message

from service.contract.records import Transform
from service.kafka.cluster import OutputLimits
from service.observability.health import Health
from service.stage import machine as sm
from service.stage.guarantees.guarantee import Guarantee
from service.stage.partition import Partition


class Host(Protocol):
    """What a runner uses of the loop that owns it: the loop's configuration as it
    is now (a test may replace any of it), and the loop's two ways to act on a
    partition (the runner decides nothing itself)."""

    committer: Guarantee
    transform: Transform
    limits: OutputLimits
    policy: sm.Policy
    health: Health

    def dispatch(self, partition: Partition, event: sm.Event) -> None: ...

    def consume_error(self, error: KafkaError, msg: Message) -> None: ...


class Runner(Protocol):
    """How a consumed batch becomes results; see the module docstring."""

    held_bytes: int  # the bytes every partition holds, consumed and not processed yet

    def bound(self, yield_at: float) -> None:
        """consume() returned: processing hands back to the loop by ``yield_at``."""

    def waiting(self) -> bool:
        """Results are on their way (out in workers): consume() must not wait."""

    def run(self, messages: Iterable[Message], now: float, wait_s: float) -> None:
        """A consumed batch, in offset order per partition; ``wait_s``: how long a
        runner whose results come back later may wait for them."""

    def drain(self, partition: Partition) -> None:
        """Process what the partition holds, before anything fetched later."""

    def discard(self, partition: Partition) -> None:
        """What the partition holds or has out is stale (a seek, an abort, a
        release): forget it; its records are read again."""

    def stop(self) -> None:
        """The replica stops (signal-handler safe): end the batch after the record
        being transformed."""


def tell_written(partition: Partition, policy: sm.Policy) -> None:
    """Tell the state machine what the partition wrote since it was last told."""
    event = sm.Wrote(partition.batch_first, partition.batch_next, partition.batch_records,
                     partition.batch_since, partition.batch_first_ts, partition.batch_last_ts)
    partition.batch_records = 0
    partition.state, _ = sm.transition(partition.state, event, policy)
