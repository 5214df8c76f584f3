"""One assigned input partition at run time: its state, the records it holds while
a commit or a lookup runs, and the background work in flight for it."""

from __future__ import annotations

import time
from concurrent.futures import Future

from confluent_kafka import Message, TopicPartition

from service.contract.records import Output
from service.stage.machine import PartitionState, Phase
from service.stage.positioning import Positioning

TopicPartitionKey = tuple[str, int]


class Partition:
    """Mutable holder around the pure ``PartitionState``; the loop thread owns it."""

    __slots__ = (
        "_state",
        "assigned_at",
        "batch_first",
        "batch_first_ts",
        "batch_last_ts",
        "batch_next",
        "batch_records",
        "batch_since",
        "committed_at",
        "epoch",
        "fetched_end",
        "flowing",
        "held",
        "held_bytes",
        "held_since",
        "inflight",
        "inflight_bytes",
        "inflight_next",
        "job",
        "key",
        "phase_since",
        "position",
        "releasing",
        "saved",
        "seek",
        "stalled_warned",
        "tp",
        "waiting_topic",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.key: TopicPartitionKey = (topic, partition)
        self.assigned_at = time.monotonic()  # a read of the overruns after it is current
        self.tp = TopicPartition(topic, partition)
        self._state = PartitionState(Phase.INITIALISING)
        self.flowing = False              # state.flowing, kept as the state changes
        # Records consumed and not processed yet, in order: while a commit or a lookup
        # runs, or handed back at the poll-gap bound (InProcess.process). Their bytes (key,
        # value, headers) are counted to pause the partition at the limits.
        self.held: list[Message] = []
        self.held_bytes = 0
        self.held_since = 0.0             # when held became non-empty: oldest drains first
        # TXSTAGE_WORKERS: bytes of its records out in worker processes, and the epoch
        # their results must still match (a seek, an abort or a release bumps it).
        self.inflight = self.inflight_bytes = 0  # records, bytes
        self.inflight_next = -1           # the offset after the last record sent out
        self.epoch = 0
        # offset -> what the transform yielded, for held records it already ran on
        # (an output topic was being looked up): they are not transformed again.
        self.saved: dict[int, list[Output]] = {}
        self.job: tuple[object, Future[Completion]] | None = None  # (token, future) in flight
        self.position = -1                # next offset expected; older ones are stale fetches
        self.seek = Positioning()         # its last seek, until checked (Positions)
        # (position, offset) of the last end of the partition the fetcher reported
        # (PARTITION_EOF): past commit markers and aborted records, which take offsets
        # that are never delivered. While the position is as it was then, the
        # partition has read everything up to that offset.
        self.fetched_end: tuple[int, int] | None = None
        self.batch_first = self.batch_next = self.batch_records = 0  # written, not yet told
        self.batch_since = 0.0
        self.batch_first_ts = self.batch_last_ts = -1  # its first and last record's timestamps
        self.releasing = False            # revoked, lost or stopping: start nothing new
        self.committed_at = -1e9          # time.monotonic() of its last commit
        self.waiting_topic: str | None = None
        self.phase_since = 0.0            # time.monotonic() of the last phase change
        self.stalled_warned = False       # partition.stalled was logged for this phase

    def describe(self, now: float) -> dict[str, object]:
        """The partition as an operator needs to see it (SIGUSR1, partition.stalled)."""
        state = self.state
        return {"partition": f"{self.topic}/{self.partition}", "phase": state.phase.value,
                "for_s": round(now - self.phase_since, 1),
                "pauses": sorted(p.value for p in state.pause_reasons),
                "open_records": state.txn.records if state.txn else 0,
                "open_age_s": round(state.age(now), 1), "position": self.position,
                "seek_pending": self.seek.landing, "held": len(self.held),
                "held_bytes": self.held_bytes,
                "job_running": self.job is not None,
                "waiting_topic": self.waiting_topic, "releasing": self.releasing}

    def read_to(self) -> int:
        """The offset the partition has read up to: its position, or the end the
        fetcher reported at this position (a commit marker's offset past it)."""
        end = self.fetched_end
        return end[1] if end is not None and end[0] == self.position else self.position

    @property
    def state(self) -> PartitionState:
        return self._state

    @state.setter
    def state(self, state: PartitionState) -> None:
        self._state = state
        self.refresh_flowing()

    def refresh_flowing(self) -> None:
        """Flowing records skip every check (the runner's): not while a seek is
        pending or the first record after one is still to be checked."""
        self.flowing = self._state.flowing and self.seek.settled

    @property
    def topic(self) -> str:
        return self.key[0]

    @property
    def partition(self) -> int:
        return self.key[1]

    def __repr__(self) -> str:
        return f"Partition({self.topic}/{self.partition} {self.state.phase.value})"


# What a finished job hands back: the event to dispatch (or None), or what it raised.
Completion = tuple[object | None, BaseException | None]
