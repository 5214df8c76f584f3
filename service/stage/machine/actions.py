"""What a transition tells the loop to do (commands) and to report (reports)."""

from __future__ import annotations

from dataclasses import dataclass

from service.stage.machine.phases import PartitionState, Txn


@dataclass(frozen=True, slots=True)
class PausePartition:
    pass


@dataclass(frozen=True, slots=True)
class ResumePartition:
    pass


@dataclass(frozen=True, slots=True)
class Seek:
    offset: int


@dataclass(frozen=True, slots=True)
class StartInit:
    """Make the partition's producer ready. ``replacing``: a producer of this
    assignment was given up (fenced, stuck, renewed after an abort), which follows
    trouble with the cluster."""

    replacing: bool = False


@dataclass(frozen=True, slots=True)
class LookupPosition:
    """Read the offset committed in Kafka. ``after_commit``: right after this
    partition's own commit, whose offsets may not be applied yet (the coordinator
    answers EndTxn before it writes the markers): only a stable read will do."""

    after_commit: bool = False


@dataclass(frozen=True, slots=True)
class StartCommit:
    txn: Txn


@dataclass(frozen=True, slots=True)
class StartAbort:
    txn: Txn | None


@dataclass(frozen=True, slots=True)
class CloseProducer:
    pass


@dataclass(frozen=True, slots=True)
class Finish:
    """Released: commit ``txn`` (falling back to an abort) or abort it; then close.
    At-least-once, ``commit`` also commits the windows sealed earlier once delivered,
    and may come with no ``txn`` (none open)."""

    txn: Txn | None
    commit: bool
    reason: str = "revoked"  # the aborted-transactions metric's label if it aborts
    deadline: float | None = None  # (monotonic) the release's: what waits, waits no longer


@dataclass(frozen=True, slots=True)
class DropProducer:
    """A call on the producer never returned: take it out without closing it (a
    close could hang the same way). The next init_transactions of its id fences it."""


@dataclass(frozen=True, slots=True)
class Abandon:
    """Released while a commit, abort or init still runs: close when it ends."""


@dataclass(frozen=True, slots=True)
class DrainHeld:
    pass


@dataclass(frozen=True, slots=True)
class DropHeld:
    pass


@dataclass(frozen=True, slots=True)
class LookupTopic:
    topic: str


@dataclass(frozen=True, slots=True)
class Fail:
    """Nothing safe is left to try: the replica fails with ``error``."""

    error: BaseException


# Reports: no effect on Kafka; the loop turns them into log lines and metrics.

@dataclass(frozen=True, slots=True)
class Committed:
    txn: Txn
    seconds: float


@dataclass(frozen=True, slots=True)
class Aborted:
    reason: str  # the aborted-transactions metric's label
    txn: Txn | None
    streak: int
    cause: str


@dataclass(frozen=True, slots=True)
class Fenced:
    txn: Txn | None
    timed_out: bool
    cause: str


@dataclass(frozen=True, slots=True)
class Isolating:
    first: int
    until: int


@dataclass(frozen=True, slots=True)
class RecordRefused:
    offset: int
    cause: str


@dataclass(frozen=True, slots=True)
class Reclaiming:
    pass


Action = (PausePartition | ResumePartition | Seek | StartInit | LookupPosition | StartCommit
          | StartAbort | CloseProducer | DropProducer | Finish | Abandon | DrainHeld | DropHeld
          | LookupTopic | Fail | Committed | Aborted | Fenced | Isolating | RecordRefused
          | Reclaiming)

Step = tuple[PartitionState, list[Action]]


def ignored(state: PartitionState) -> Step:
    """An event that no longer applies (e.g. a late completion after a release)."""
    return state, []
