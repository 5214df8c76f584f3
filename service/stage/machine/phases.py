"""A partition's condition: its phase, pause reasons, open transaction and the
policy transitions read; ``LEGAL`` lists the phase changes a transition may make."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from service.errors import (
    Failure,
    KafkaOperationError,
)


class Phase(Enum):
    INITIALISING = "initialising"  # the producer is created and init_transactions()-ed
    POSITIONING = "positioning"    # the committed offset is being read from Kafka
    ACTIVE = "active"              # records flow into the open transaction
    COMMITTING = "committing"      # a commit runs beside the loop; records wait in order
    ABORTING = "aborting"          # an abort runs beside the loop
    FENCED = "fenced"              # the producer is closed; reclaimed if still owned later
    RELEASED = "released"          # revoked or lost: finished and closed


class Pause(Enum):
    INIT = "init"            # INITIALISING
    POSITION = "position"    # POSITIONING
    ABORT = "abort"          # ABORTING
    FENCED = "fenced"        # FENCED
    BACKOFF = "backoff"      # retrying after aborts or a poison record, later
    BACKLOG = "backlog"      # too many records (or bytes) held
    LOOKUP = "lookup"        # an output topic's limits are being looked up


_PHASE_PAUSE = {Phase.INITIALISING: Pause.INIT, Phase.POSITIONING: Pause.POSITION,
                Phase.ABORTING: Pause.ABORT, Phase.FENCED: Pause.FENCED}


@dataclass(frozen=True, slots=True)
class Txn:
    """The open transaction (at-least-once: the open delivery window)."""

    first: int        # its first input offset
    next: int         # last processed input offset + 1: what a commit sends
    records: int
    opened_at: float  # time.monotonic()
    first_ts_ms: int = -1  # the first and last input record's timestamps (-1: none)
    last_ts_ms: int = -1

    @property
    def last(self) -> int:
        return self.next - 1

    @property
    def empty(self) -> bool:
        """Neither records nor a new position: a spanning commit's empty joiner."""
        return not self.records and self.next == self.first


@dataclass(frozen=True, slots=True)
class Isolation:
    """The broker refused an output of a record below ``until``: transactions hold at
    most ``cap`` records until the record is found (bisection)."""

    until: int
    remaining: int  # records left before ``until``
    cap: int


@dataclass(frozen=True, slots=True)
class Overrun:
    """A transform call on the record at ``offset`` ran past the time-out (``timeout_ms``)
    ``count`` times, as an earlier owner recorded it (stage/transform_watch.py)."""

    offset: int
    count: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Policy:
    """The settings transitions depend on."""

    commit_interval_s: float = 0.1  # TXSTAGE_COMMIT_INTERVAL_MS
    # The interval the replica's transaction budget stretches it to (stage/budget.py;
    # 0: none). A transaction is due after ``interval_s``, the longer of the two.
    stretched_interval_s: float = 0.0
    commit_max_records: int = 5000
    max_abort_streak: int = 10
    retry_backoff_s: float = 0.2
    max_backoff_s: float = 30.0
    max_record_attempts: int = 5
    reclaim_after_s: float = 45.0
    transaction_timeout_s: float = 60.0
    stuck_after_s: float = 100.0  # a commit or abort still running: its producer is stuck
    # Held records (consumed, not processed yet): a partition pauses at the first of
    # these it reaches, per partition or for the replica (docs/state-machine.md).
    backlog_limit: int = 5000
    held_partition_max_bytes: int = 16 * 1024 * 1024
    held_max_bytes: int = 64 * 1024 * 1024
    # The longest the loop processes between two consume() calls, but for one record's
    # transform (docs/state-machine.md, "Time bounds the work").
    poll_gap_s: float = 1.0
    # Exactly-once: a new producer after every abort. Its init_transactions bumps the
    # epoch, so a request of the aborted transaction still in flight (a TxnOffsetCommit
    # held in the network past the client's time-out) is fenced instead of joining the
    # next transaction of the same producer id (librdkafka has no KIP-890 part 2).
    renew_after_abort: bool = True
    # At-least-once: a commit only seals a delivery window, its offsets are committed
    # once delivered, later. So a healthy release commits with no window open too.
    commits_deferred: bool = False

    @property
    def interval_s(self) -> float:
        """The commit interval in force."""
        return max(self.commit_interval_s, self.stretched_interval_s)


@dataclass(frozen=True, slots=True)
class PartitionState:
    phase: Phase
    pauses: frozenset[Pause] = frozenset()  # explicit reasons; see ``pause_reasons``
    txn: Txn | None = None
    abort_streak: int = 0                   # aborts since the last commit (refusals excluded)
    poison_offset: int | None = None        # the record the transform keeps failing on
    poison_attempts: int = 0
    isolation: Isolation | None = None
    # At-least-once: an output written without naming its record failed; records
    # below this offset are written naming theirs, so a refusal finds its record.
    name_until: int | None = None
    refused: Mapping[int, str] = field(default_factory=dict)  # offset -> what the broker said
    suspects: Mapping[int, str] = field(default_factory=dict)  # named once; retried once
    failures: tuple[Failure, ...] = ()      # delivery failures of the transaction being aborted
    abort_error: KafkaOperationError | None = None
    resume_at: float | None = None          # end of BACKOFF
    fenced_at: float | None = None
    reposition_after_commit: bool = False   # a poison retry: resume from Kafka after the commit
    commit_uncertain: bool = False          # a commit timed out: it may have succeeded
    overrun: Overrun | None = None          # a record whose transform call overran, ahead
    # The input offset last committed (at-least-once: sealed) or found committed (< 0:
    # none): a partition idle at its end commits the end past the markers after it.
    committed: int = -1

    @property
    def pause_reasons(self) -> frozenset[Pause]:
        implied = _PHASE_PAUSE.get(self.phase)
        return self.pauses | {implied} if implied else self.pauses

    @property
    def paused(self) -> bool:
        return bool(self.pause_reasons)

    @property
    def holding(self) -> bool:
        """Records that arrive now wait, in order, for the partition to go on."""
        phase = self.phase
        return phase is Phase.COMMITTING or (
            phase is Phase.ACTIVE and bool(self.pauses) and Pause.LOOKUP in self.pauses)

    @property
    def flowing(self) -> bool:
        """Records are processed as they come, with nothing to check per record:
        the loop's fast path (evaluated once per state change, not per record)."""
        return self.phase is Phase.ACTIVE and not self.pauses and self.isolation is None \
            and not self.refused and self.name_until is None and self.overrun is None

    @property
    def ready(self) -> bool:
        return self.phase in (Phase.ACTIVE, Phase.COMMITTING)

    def room(self) -> int | None:
        """How many more records the open transaction may take (None: no limit)."""
        if self.isolation is None:
            return None
        return self.isolation.cap - (self.txn.records if self.txn else 0)

    def due(self, now: float, policy: Policy) -> bool:
        txn = self.txn
        if self.phase is not Phase.ACTIVE or txn is None:
            return False
        if now - txn.opened_at >= policy.interval_s or \
                txn.records >= policy.commit_max_records:
            return True
        return self.isolation is not None and txn.records >= self.isolation.cap

    def age(self, now: float) -> float:
        return 0.0 if self.txn is None else now - self.txn.opened_at


# Every change of phase a transition may make (docs/state-machine.md draws it);
# ``transition`` checks each change against it. Any phase may go to RELEASED.
LEGAL: Mapping[Phase, frozenset[Phase]] = {
    Phase.INITIALISING: frozenset({Phase.POSITIONING, Phase.FENCED}),
    Phase.POSITIONING: frozenset({Phase.ACTIVE, Phase.ABORTING}),
    Phase.ACTIVE: frozenset({Phase.COMMITTING, Phase.POSITIONING, Phase.ABORTING,
                             Phase.FENCED}),
    Phase.COMMITTING: frozenset({Phase.ACTIVE, Phase.POSITIONING, Phase.ABORTING,
                                 Phase.FENCED}),
    Phase.ABORTING: frozenset({Phase.INITIALISING, Phase.POSITIONING, Phase.FENCED}),
    Phase.FENCED: frozenset({Phase.INITIALISING}),
    Phase.RELEASED: frozenset(),
}
