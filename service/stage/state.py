"""One input partition's condition, and every legal transition, in one place.

A partition is always in exactly one phase::

    INITIALISING ──InitDone──▶ POSITIONING ──Positioned──▶ ACTIVE ◀──────────────┐
       ▲    ▲                       ▲                     │  │ CommitDue      │ CommitDone
       │    │ Tick (reclaim)        │ AbortDone (ALO)     │  ▼                │
       │  FENCED ◀──fenced──── ABORTING ◀──abortable── COMMITTING ──────────┘
       │                         │ ▲                     │
       └── AbortDone (EOS: ──────┘ └── ProduceFailed / DeliveryFailed (ACTIVE;
           a new producer)                  ALO: DeliveryFailed from POSITIONING too)
    any phase ──Released──▶ RELEASED  (revoked: commit what is healthy; lost: abort)

Besides its phase a partition holds a set of pause reasons; the consumer pauses
the partition while the set is non-empty. Waiting phases (INITIALISING,
POSITIONING, ABORTING, FENCED) imply their own reason; BACKOFF, BACKLOG and
LOOKUP are explicit.

Every transition is a pure function ``(state, event) -> (state, actions)``;
the loop executes the actions (seek, pause, resume, start a commit, ...) and
never decides anything itself. Resume points always come from the offsets
committed in Kafka (``LookupPosition`` → ``Positioned``), never from memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TypeVar

from confluent_kafka import KafkaError

from service.errors import (
    AbortableError,
    FencedError,
    KafkaOperationError,
    PoisonRecordError,
    RetriableError,
    Where,
)
from service.kafka.delivery import REFUSALS, Failure
from service.kafka.errors import DENIALS, DeniedError

# --------------------------------------------------------------------------- the state


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
    BACKLOG = "backlog"      # too many records held while committing
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


@dataclass(frozen=True, slots=True)
class Isolation:
    """The broker refused an output of a record below ``until``: transactions hold at
    most ``cap`` records until the record is found (bisection)."""

    until: int
    remaining: int  # records left before ``until``
    cap: int


@dataclass(frozen=True, slots=True)
class Policy:
    """The settings transitions depend on."""

    commit_interval_s: float = 0.1
    commit_max_records: int = 5000
    max_abort_streak: int = 10
    retry_backoff_s: float = 0.2
    max_backoff_s: float = 30.0
    max_record_attempts: int = 5
    reclaim_after_s: float = 45.0
    transaction_timeout_s: float = 60.0
    stuck_after_s: float = 100.0  # a commit or abort still running: its producer is stuck
    backlog_limit: int = 5000
    # Exactly-once: a new producer after every abort. Its init_transactions bumps the
    # epoch, so a request of the aborted transaction still in flight (a TxnOffsetCommit
    # held in the network past the client's time-out) is fenced instead of joining the
    # next transaction of the same producer id (librdkafka has no KIP-890 part 2).
    renew_after_abort: bool = True
    # At-least-once: a commit only seals a delivery window, its offsets are committed
    # once delivered, later. So a healthy release commits with no window open too.
    commits_deferred: bool = False


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
            and not self.refused and self.name_until is None

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
        if now - txn.opened_at >= policy.commit_interval_s or \
                txn.records >= policy.commit_max_records:
            return True
        return self.isolation is not None and txn.records >= self.isolation.cap

    def age(self, now: float) -> float:
        return 0.0 if self.txn is None else now - self.txn.opened_at


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Wrote:
    """Records ``first``..``next - 1`` were written into the transaction (one batch)."""

    first: int
    next: int
    records: int
    now: float
    first_ts_ms: int = -1  # the batch's first and last record's timestamps
    last_ts_ms: int = -1


@dataclass(frozen=True, slots=True)
class InitDone:
    now: float


@dataclass(frozen=True, slots=True)
class InitFailed:
    error: BaseException
    now: float


@dataclass(frozen=True, slots=True)
class Positioned:
    """The offset committed in Kafka (read_committed: RequireStable); < 0 when none."""

    offset: int
    now: float


@dataclass(frozen=True, slots=True)
class PositionFailed:
    error: BaseException


@dataclass(frozen=True, slots=True)
class CommitDue:
    now: float


@dataclass(frozen=True, slots=True)
class CommitDone:
    seconds: float
    now: float


@dataclass(frozen=True, slots=True)
class CommitFailed:
    error: KafkaOperationError
    failures: tuple[Failure, ...]
    now: float


@dataclass(frozen=True, slots=True)
class ProduceFailed:
    error: KafkaOperationError
    now: float


@dataclass(frozen=True, slots=True)
class DeliveryFailed:
    """At-least-once: outputs of this partition were not delivered. ``through``: the
    end of the failed outputs' records (a failure written unnamed is below it)."""

    failures: tuple[Failure, ...]
    now: float
    through: int | None = None


@dataclass(frozen=True, slots=True)
class AbortDone:
    failures: tuple[Failure, ...]
    now: float


@dataclass(frozen=True, slots=True)
class AbortFailed:
    error: KafkaOperationError
    now: float


@dataclass(frozen=True, slots=True)
class Poisoned:
    """The transform failed on a record and there is no dead-letter topic."""

    error: PoisonRecordError
    now: float


@dataclass(frozen=True, slots=True)
class BacklogFull:
    pass


@dataclass(frozen=True, slots=True)
class TopicUnknown:
    """An output goes to a topic whose limits are not known yet: look them up."""

    topic: str


@dataclass(frozen=True, slots=True)
class TopicResolved:
    topic: str


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


@dataclass(frozen=True, slots=True)
class CallStuck:
    """The commit or abort running beside the loop has not returned long after its
    own deadline: librdkafka can miss a call's timeout (librdkafka#5456, #5511: a
    coordinator request that is never retried after a broker restart)."""

    now: float


@dataclass(frozen=True, slots=True)
class Released:
    """Revoked (``lost=False``), lost, or the replica stops (``reason``)."""

    lost: bool
    now: float
    reason: str = "revoked"
    deadline: float | None = None  # (monotonic) by when the release must be over


Event = (Wrote | InitDone | InitFailed | Positioned | PositionFailed | CommitDue | CommitDone
         | CommitFailed | ProduceFailed | DeliveryFailed | AbortDone | AbortFailed | Poisoned
         | BacklogFull | TopicUnknown | TopicResolved | Tick | CallStuck | Released)

# --------------------------------------------------------------------------- actions


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

# --------------------------------------------------------------------------- transitions


def assigned() -> Step:
    """A newly assigned partition: paused until its producer is ready and its
    position is read from Kafka."""
    return PartitionState(Phase.INITIALISING), [PausePartition(), StartInit()]


def transition(state: PartitionState, event: Event, policy: Policy) -> Step:
    """The one entry point: the new state and what the loop must do, in order.

    Pause and resume are derived: they follow whether the partition has any
    pause reason before and after."""
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise TypeError(f"not an event: {event!r}")
    new, actions = handler(state, event, policy)
    if new.phase is Phase.RELEASED:
        return new, actions  # no longer assigned: nothing to pause or resume
    if new.paused and not state.paused:
        actions.insert(0, PausePartition())
    elif state.paused and not new.paused:
        actions.append(ResumePartition())
    return new, actions


E = TypeVar("E")
Handler = Callable[[PartitionState, E, Policy], Step]
_HANDLERS: dict[type, Handler[object]] = {}


def _on(kind: type[E]) -> Callable[[Handler[E]], Handler[E]]:
    def register(handler: Handler[E]) -> Handler[E]:
        _HANDLERS[kind] = handler  # type: ignore[assignment]
        return handler
    return register


def _ignored(state: PartitionState) -> Step:
    """An event that no longer applies (e.g. a late completion after a release)."""
    return state, []


@_on(Wrote)
def _wrote(state: PartitionState, event: Wrote, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE:
        return _ignored(state)
    txn = state.txn
    if txn is None:
        txn = Txn(event.first, event.next, event.records, event.now, event.first_ts_ms,
                  event.last_ts_ms)
    else:
        txn = replace(txn, next=event.next, records=txn.records + event.records,
                      last_ts_ms=event.last_ts_ms)
    return replace(state, txn=txn), []


@_on(InitDone)
def _init_done(state: PartitionState, event: InitDone, policy: Policy) -> Step:
    if state.phase is not Phase.INITIALISING:
        return _ignored(state)
    return replace(state, phase=Phase.POSITIONING, fenced_at=None), [LookupPosition()]


@_on(InitFailed)
def _init_failed(state: PartitionState, event: InitFailed, policy: Policy) -> Step:
    if state.phase is not Phase.INITIALISING:
        return _ignored(state)
    if isinstance(event.error, FencedError):  # a newer producer holds the id: wait and see
        return replace(state, phase=Phase.FENCED, fenced_at=event.now), [
            Fenced(None, False, str(event.error))]
    if isinstance(event.error, RetriableError):
        # Timed out past its deadline. A producer made while the only broker was
        # frozen was seen to stay "all brokers down" for good (it never re-bootstraps,
        # kafka_config.py): the failed one is closed, a fresh one bootstraps anew.
        # The partition stays paused (and reported stalled) meanwhile.
        return state, [StartInit(replacing=True)]
    return state, [Fail(event.error)]


@_on(Positioned)
def _positioned(state: PartitionState, event: Positioned, policy: Policy) -> Step:
    if state.phase is not Phase.POSITIONING:
        return _ignored(state)
    offset = event.offset
    isolation, refused, name_until = state.isolation, state.refused, state.name_until
    if offset >= 0:  # what Kafka says is behind us is settled
        if isolation is not None and offset >= isolation.until:
            isolation = None
        if name_until is not None and offset >= name_until:
            name_until = None
        refused = {o: why for o, why in refused.items() if o >= offset}
        suspects = {o: why for o, why in state.suspects.items() if o >= offset}
    else:
        suspects = dict(state.suspects)
    pauses = state.pauses
    if state.resume_at is not None and event.now < state.resume_at:
        pauses = pauses | {Pause.BACKOFF}
    return replace(state, phase=Phase.ACTIVE, txn=None, isolation=isolation, refused=refused,
                   name_until=name_until, suspects=suspects, pauses=pauses, failures=(),
                   abort_error=None), [Seek(offset)]


@_on(PositionFailed)
def _position_failed(state: PartitionState, event: PositionFailed, policy: Policy) -> Step:
    if state.phase is not Phase.POSITIONING:
        return _ignored(state)
    return state, [Fail(event.error)]


@_on(CommitDue)
def _commit_due(state: PartitionState, event: CommitDue, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE or state.txn is None:
        return _ignored(state)
    return replace(state, phase=Phase.COMMITTING), [StartCommit(state.txn)]


@_on(CommitDone)
def _commit_done(state: PartitionState, event: CommitDone, policy: Policy) -> Step:
    if state.phase is not Phase.COMMITTING or state.txn is None:
        return _ignored(state)
    txn = state.txn
    isolation = state.isolation
    if isolation is not None:
        remaining = isolation.remaining - txn.records
        isolation = None if txn.next >= isolation.until or remaining <= 0 else \
            Isolation(isolation.until, remaining, max(1, math.ceil(remaining / 2)))
    name_until = state.name_until
    if name_until is not None and txn.next >= name_until:
        name_until = None  # every record below it was written named
    poison = state.poison_offset
    # Refused offsets stay until Kafka's committed offset passes them (Positioned):
    # an at-least-once "commit" only seals a window, and a rewind may go back before it.
    committed = replace(
        state, txn=None, abort_streak=0, isolation=isolation, name_until=name_until,
        poison_offset=None if poison is not None and txn.next > poison else poison,
        poison_attempts=0 if poison is not None and txn.next > poison else state.poison_attempts,
        pauses=state.pauses - {Pause.BACKLOG})
    report = Committed(txn, event.seconds)
    if state.reposition_after_commit:
        return replace(committed, phase=Phase.POSITIONING, reposition_after_commit=False), [
            report, DropHeld(), LookupPosition(after_commit=True)]
    return replace(committed, phase=Phase.ACTIVE), [report, DrainHeld()]


@_on(CommitFailed)
def _commit_failed(state: PartitionState, event: CommitFailed, policy: Policy) -> Step:
    if state.phase is not Phase.COMMITTING:
        return _ignored(state)
    error = event.error
    if isinstance(error, RetriableError) and error.where.op == "commit_transaction":
        # It may have committed: never abort it. The next owner's init finishes it.
        return replace(state, commit_uncertain=True), [Fail(error)]
    if isinstance(error, RetriableError):
        # send_offsets_to_transaction did not finish by its deadline: nothing was
        # committed, and the producer will not take another call while that one is
        # pending (librdkafka answers _CONFLICT). Replace it, as after a fence.
        return _fence(state, error, event.now, policy)
    return _fault(replace(state, reposition_after_commit=False), error, event.failures,
                  event.now, policy)


@_on(ProduceFailed)
def _produce_failed(state: PartitionState, event: ProduceFailed, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE:
        return _ignored(state)
    return _fault(state, event.error, (), event.now, policy)


@_on(DeliveryFailed)
def _delivery_failed(state: PartitionState, event: DeliveryFailed, policy: Policy) -> Step:
    # POSITIONING too: after a poison retry the partition positions while the windows
    # it sealed are still in flight. Ignored there, the failure stayed blamed in the
    # committer with its window at the head of the queue: no later offset of the
    # partition was committed and no later failure reported. The abort forgets them;
    # the position is looked up again (the lookup under way is superseded).
    if state.phase not in (Phase.ACTIVE, Phase.COMMITTING, Phase.POSITIONING):
        return _ignored(state)
    # Everything after the committed offset is redone. A report of a record written
    # named names it, so no transaction range is needed to find a refused one; a
    # flowing partition writes unnamed (a callback object per record costs more than
    # the rest of the bookkeeping), so after such a failure the records up to the
    # failed ones are written again named: a refusal that repeats then names its own.
    name_until = state.name_until
    if event.through is not None and any(f.offset is None for f in event.failures):
        name_until = max(name_until or 0, event.through)
    return _abort(replace(state, txn=None, name_until=name_until), None, event.failures)


def _fault(state: PartitionState, error: KafkaOperationError, failures: tuple[Failure, ...],
           now: float, policy: Policy) -> Step:
    """A failed Kafka call, acted on as its class says."""
    if isinstance(error, AbortableError):
        return _abort(state, error, failures)
    if isinstance(error, FencedError):
        return _fence(state, error, now, policy)
    return state, [Fail(error)]  # retriable past its deadline, or fatal


def _abort(state: PartitionState, error: KafkaOperationError | None,
           failures: tuple[Failure, ...]) -> Step:
    return replace(state, phase=Phase.ABORTING, failures=state.failures + failures,
                   abort_error=error, pauses=state.pauses - {Pause.BACKLOG, Pause.LOOKUP}), [
        DropHeld(), StartAbort(state.txn)]


def _fence(state: PartitionState, error: KafkaOperationError, now: float,
           policy: Policy) -> Step:
    """Another producer owns the transactional id now (another replica took the
    partition, or the coordinator timed the transaction out): never publish under
    this producer again. If the partition is still ours a session time-out later,
    a new producer takes over from the committed offset."""
    txn = state.txn
    timed_out = txn is not None and state.age(now) >= policy.transaction_timeout_s
    return replace(state, phase=Phase.FENCED, fenced_at=now, txn=None, failures=(),
                   abort_error=None, reposition_after_commit=False,
                   pauses=state.pauses - {Pause.BACKLOG, Pause.LOOKUP}), [
        DropHeld(), CloseProducer(), Fenced(txn, timed_out, str(error))]


@_on(AbortDone)
def _abort_done(state: PartitionState, event: AbortDone, policy: Policy) -> Step:
    if state.phase is not Phase.ABORTING:
        return _ignored(state)
    txn = state.txn
    failures = state.failures + event.failures
    denied = _denied(state.abort_error, failures)
    if denied is not None:  # sending again cannot help while the ACL is missing
        return state, [Fail(denied)]
    cause = _cause(state.abort_error, failures)
    refusals = [f for f in failures if f.refusal]
    if state.abort_error is not None and state.abort_error.code in REFUSALS:
        # Refused at produce(): the call names its record.
        refusals.append(Failure(state.abort_error.code, "", str(state.abort_error),
                                state.abort_error.where.offset))
    actions: list[Action] = []
    streak, isolation, refused = state.abort_streak, state.isolation, dict(state.refused)
    suspects = dict(state.suspects)
    if refusals:
        culprits = _culprits(refusals, txn)
        if culprits is None and txn is not None:
            isolation = Isolation(txn.next, txn.records, max(1, math.ceil(txn.records / 2)))
            actions.append(Isolating(txn.first, txn.next))
        alone = txn is not None and txn.records == 1
        for offset in sorted(culprits or ()):
            if offset in refused:  # its dead letter was refused too: nothing left to try
                return state, [Fail(_with_note(state.abort_error, cause,
                                               f"the dead letter of offset {offset} was "
                                               f"refused as well: {cause}"))]
            if offset not in suspects and not alone:
                # Named once: sent again before it is dead-lettered, so a refusal that
                # does not repeat (a transient one) costs a retry, not the record.
                suspects[offset] = cause
                continue
            suspects.pop(offset, None)
            refused[offset] = cause
            actions.append(RecordRefused(offset, cause))
    else:
        streak += 1
        if streak >= policy.max_abort_streak:  # the same input keeps failing
            where = f"; the last covered input offsets {txn.first}..{txn.last}" if txn else ""
            return state, [Fail(_with_note(state.abort_error, cause,
                                           f"{streak} aborts in a row{where}"))]
    resume_at = state.resume_at
    if streak > 1:  # the first retry is immediate; later ones back off
        resume_at = event.now + _backoff(streak - 1, policy)
    actions.insert(0, Aborted("abortable_error", txn, streak, cause))
    phase = Phase.POSITIONING
    if policy.renew_after_abort:
        phase = Phase.INITIALISING
        actions += [CloseProducer(), StartInit(replacing=True)]
    else:
        actions.append(LookupPosition())
    return replace(state, phase=phase, txn=None, abort_streak=streak,
                   isolation=isolation, refused=refused, suspects=suspects, failures=(),
                   abort_error=None, resume_at=resume_at), actions


@_on(AbortFailed)
def _abort_failed(state: PartitionState, event: AbortFailed, policy: Policy) -> Step:
    if state.phase is not Phase.ABORTING:
        return _ignored(state)
    if isinstance(event.error, FencedError):
        # The coordinator had already aborted it (timed out) or another owner fenced
        # us. Either way the transaction is gone; the position comes from Kafka.
        return _fence(state, event.error, event.now, policy)
    if isinstance(event.error, RetriableError):
        # The abort did not finish by its deadline: the producer is stuck. Replace it;
        # the next init_transactions of its id aborts the transaction for us.
        return _fence(state, event.error, event.now, policy)
    if policy.renew_after_abort:
        # The producer is unusable (seen in the soak: INVALID_TXN_STATE on the abort
        # after the coordinator's broker died while outputs timed out). Nobody else
        # claimed the id, so no fence to wait out: a new producer's init_transactions
        # aborts what is open, exactly as a restart of the replica would, without the
        # restart. Counted as an abort: a producer that keeps failing so still fails
        # the replica after ``max_abort_streak``.
        return _abort_done(replace(state, abort_error=event.error), AbortDone((), event.now),
                           policy)
    return state, [Fail(event.error)]


@_on(Poisoned)
def _poisoned(state: PartitionState, event: Poisoned, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE:
        return _ignored(state)
    offset = event.error.offset
    attempts = state.poison_attempts + 1 if state.poison_offset == offset else 1
    report = Aborted("poison", None, attempts, str(event.error))
    if attempts >= policy.max_record_attempts:
        return state, [report, Fail(event.error)]
    resume_at = event.now + _backoff(attempts, policy)
    state = replace(state, poison_offset=offset, poison_attempts=attempts, resume_at=resume_at,
                    pauses=state.pauses | {Pause.BACKOFF})
    if state.txn is not None:
        # The poison record's outputs were never produced: what is open is a healthy
        # prefix. Commit it; Kafka's committed offset is then the poison record.
        return replace(state, phase=Phase.COMMITTING, reposition_after_commit=True), [
            report, StartCommit(state.txn)]
    # A commit of this partition may have just ended (CommitDone, then the poison
    # record in the records it held): only a stable read may say where to resume.
    return replace(state, phase=Phase.POSITIONING), [report, DropHeld(),
                                                     LookupPosition(after_commit=True)]


@_on(BacklogFull)
def _backlog_full(state: PartitionState, event: BacklogFull, policy: Policy) -> Step:
    if state.phase is not Phase.COMMITTING:
        return _ignored(state)
    return replace(state, pauses=state.pauses | {Pause.BACKLOG}), []


@_on(TopicUnknown)
def _topic_unknown(state: PartitionState, event: TopicUnknown, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE:
        return _ignored(state)
    return replace(state, pauses=state.pauses | {Pause.LOOKUP}), [LookupTopic(event.topic)]


@_on(TopicResolved)
def _topic_resolved(state: PartitionState, event: TopicResolved, policy: Policy) -> Step:
    if Pause.LOOKUP not in state.pauses:
        return _ignored(state)
    state = replace(state, pauses=state.pauses - {Pause.LOOKUP})
    return state, [DrainHeld()] if state.phase is Phase.ACTIVE else []


@_on(Tick)
def _tick(state: PartitionState, event: Tick, policy: Policy) -> Step:
    if Pause.BACKOFF in state.pauses and state.resume_at is not None \
            and event.now >= state.resume_at:
        return replace(state, pauses=state.pauses - {Pause.BACKOFF}, resume_at=None), []
    if state.phase is Phase.FENCED and state.fenced_at is not None \
            and event.now - state.fenced_at >= policy.reclaim_after_s:
        # Still assigned a session time-out after the fence: the consumer really owns
        # the partition (the coordinator timed our transaction out). Waiting that long
        # keeps a zombie from fencing the real owner.
        return replace(state, phase=Phase.INITIALISING, fenced_at=None), [
            Reclaiming(), StartInit(replacing=True)]
    return _ignored(state)


@_on(CallStuck)
def _call_stuck(state: PartitionState, event: CallStuck, policy: Policy) -> Step:
    """Treated as a fence: whatever the stuck call did, the transaction never
    completes under this producer. A new producer takes over after a session
    time-out if the partition is still ours; its init_transactions completes or
    aborts what was open, and the position then comes from Kafka."""
    if state.phase not in (Phase.COMMITTING, Phase.ABORTING):
        return _ignored(state)
    txn = state.txn
    return replace(state, phase=Phase.FENCED, fenced_at=event.now, txn=None, failures=(),
                   abort_error=None, reposition_after_commit=False, commit_uncertain=False,
                   pauses=state.pauses - {Pause.BACKLOG, Pause.LOOKUP}), [
        DropHeld(), DropProducer(),
        Fenced(txn, True, f"a {state.phase.value} call on the producer did not return in "
                          f"{policy.stuck_after_s:.0f} s")]


@_on(Released)
def _released(state: PartitionState, event: Released, policy: Policy) -> Step:
    """Revoke or stop: commit what is healthy, else abort; lost: abort, never commit.
    Either way the producer closes. The caller first waits (bounded) for work that
    was running, so only a job that overran its wait is abandoned here.

    At-least-once (``commits_deferred``) a healthy release commits with no window
    open as well: a window just sealed leaves ``txn`` None while its offsets wait to
    be delivered and committed. Told to commit nothing, the committer dropped them
    (the next owner redid them) and did not wait for its outputs in flight."""
    phase, txn = state.phase, state.txn
    done = replace(state, phase=Phase.RELEASED, txn=None)
    if phase in (Phase.RELEASED, Phase.FENCED):
        return done, [DropHeld()]
    if phase in (Phase.INITIALISING, Phase.COMMITTING, Phase.ABORTING):
        return done, [DropHeld(), Abandon()]
    if state.commit_uncertain:  # it may have committed: close without an abort
        return done, [DropHeld(), Abandon()]
    # ACTIVE or POSITIONING. Exactly-once: no transaction open, nothing to commit.
    healthy = not event.lost and (policy.commits_deferred or (
        phase is Phase.ACTIVE and txn is not None))
    return done, [DropHeld(), Finish(txn, healthy, event.reason, event.deadline)]


# --------------------------------------------------------------------------- helpers


def _culprits(refusals: list[Failure], txn: Txn | None) -> set[int] | None:
    """The input offsets whose outputs the broker refused, or None when the reports
    cannot tell (then the transaction's range is bisected).

    Each report names the input record of its output. The broker refuses a whole
    batch at times (librdkafka then reports every record of it), so only a single
    record named by every refusal is taken as the culprit inside a transaction; a
    transaction of one record is its own culprit. Without a transaction
    (at-least-once) there is nothing to bisect with, so every named record is."""
    # (A refusal at produce() names the record after the transaction's last: ``next``.)
    inside = (lambda o: txn.first <= o <= txn.next) if txn is not None else (lambda o: True)
    named = {f.offset for f in refusals if f.offset is not None and inside(f.offset)}
    if txn is None:
        return named
    if len(named) == 1:
        return named
    if txn.records == 1:
        return {txn.first}
    return None


def _backoff(attempt: int, policy: Policy) -> float:
    return float(min(policy.retry_backoff_s * 2 ** (attempt - 1), policy.max_backoff_s))


def _denied(error: KafkaOperationError | None,
            failures: tuple[Failure, ...]) -> DeniedError | None:
    """The broker refused the principal (an output's delivery or the call itself)."""
    if isinstance(error, DeniedError):
        return error
    for failure in failures:
        if failure.code in DENIALS:
            return DeniedError(Where("produce"), KafkaError(failure.code, failure.message))
    return None


def _cause(error: KafkaOperationError | None, failures: tuple[Failure, ...]) -> str:
    """The real cause: the first refused output, else the first failed one, else
    the call's own error (a produce() _STATE only says the transaction had failed)."""
    for failure in sorted(failures, key=lambda f: not f.refusal):
        return f"{failure.name}: {failure.message}"
    return str(error) if error is not None else "delivery failed"


def _with_note(error: BaseException | None, cause: str, note: str) -> BaseException:
    failed = error if error is not None else RuntimeError(cause)
    failed.add_note(note)
    return failed
