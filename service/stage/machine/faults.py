"""Transitions after a failed call: abort, fence, a refused record found by bisection,
a poison record, a stuck call."""

from __future__ import annotations

import math
from dataclasses import replace

from service.error_codes import DENIALS, REFUSALS
from service.errors import (
    AbortableError,
    DeniedError,
    Failure,
    FencedError,
    KafkaOperationError,
    RetriableError,
    SharedAbortError,
    Where,
)
from service.stage.machine.actions import (
    Aborted,
    Action,
    CloseProducer,
    DropHeld,
    DropProducer,
    Fail,
    Fenced,
    Isolating,
    LookupPosition,
    RecordRefused,
    StartAbort,
    StartCommit,
    StartInit,
    Step,
    ignored,
)
from service.stage.machine.events import (
    AbortDone,
    AbortFailed,
    CallStuck,
    CommitFailed,
    DeliveryFailed,
    InitFailed,
    Poisoned,
    PositionFailed,
    ProduceFailed,
    SpanAborted,
)
from service.stage.machine.phases import Isolation, PartitionState, Pause, Phase, Policy, Txn


def init_failed(state: PartitionState, event: InitFailed, policy: Policy) -> Step:
    if state.phase is not Phase.INITIALISING:
        return ignored(state)
    if isinstance(event.error, FencedError):  # a newer producer holds the id: wait and see
        return replace(state, phase=Phase.FENCED, fenced_at=event.now), [
            Fenced(None, False, str(event.error))]
    if isinstance(event.error, RetriableError):
        # Timed out past its deadline. A producer made while the only broker is
        # frozen can stay "all brokers down" for good (it never re-bootstraps,
        # kafka_config.py): the failed one is closed, a fresh one bootstraps anew.
        # The partition stays paused (and reported stalled) meanwhile.
        return state, [StartInit(replacing=True)]
    return state, [Fail(event.error)]


def position_failed(state: PartitionState, event: PositionFailed, policy: Policy) -> Step:
    if state.phase is not Phase.POSITIONING:
        return ignored(state)
    return state, [Fail(event.error)]


def commit_failed(state: PartitionState, event: CommitFailed, policy: Policy) -> Step:
    if state.phase is not Phase.COMMITTING:
        return ignored(state)
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


def produce_failed(state: PartitionState, event: ProduceFailed, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE:
        return ignored(state)
    return _fault(state, event.error, (), event.now, policy)


def delivery_failed(state: PartitionState, event: DeliveryFailed, policy: Policy) -> Step:
    # POSITIONING too: after a poison retry the partition positions while the windows
    # it sealed are still in flight. Ignored there, the failure would stay blamed in
    # the committer with its window at the head of the queue: no later offset of the
    # partition committed and no later failure reported. The abort forgets them;
    # the position is looked up again (the lookup under way is superseded).
    if state.phase not in (Phase.ACTIVE, Phase.COMMITTING, Phase.POSITIONING):
        return ignored(state)
    # Everything after the committed offset is redone. A report of a record written
    # named names it, so no transaction range is needed to find a refused one; a
    # flowing partition writes unnamed (a callback object per record costs more than
    # the rest of the bookkeeping), so after such a failure the records up to the
    # failed ones are written again named: a refusal that repeats then names its own.
    name_until = state.name_until
    if event.through is not None and any(f.offset is None for f in event.failures):
        name_until = max(name_until or 0, event.through)
    return _abort(replace(state, txn=None, name_until=name_until), None, event.failures)


def span_aborted(state: PartitionState, event: SpanAborted, policy: Policy) -> Step:
    """Spanning: another partition aborts the replica's transaction. An active or
    positioning partition aborts with it (nothing of its own is counted against it)
    and, like any aborted one, reads again from Kafka with a new producer."""
    if state.phase not in (Phase.ACTIVE, Phase.POSITIONING):
        return ignored(state)
    return _abort(state, event.error, ())


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


def abort_done(state: PartitionState, event: AbortDone, policy: Policy) -> Step:
    if state.phase is not Phase.ABORTING:
        return ignored(state)
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
    elif not isinstance(state.abort_error, SharedAbortError):  # another's abort: not ours
        streak += 1
        if streak >= policy.max_abort_streak:  # the same input keeps failing
            where = f"; the last covered input offsets {txn.first}..{txn.last}" if txn else ""
            return state, [Fail(_with_note(state.abort_error, cause,
                                           f"{streak} aborts in a row{where}"))]
    resume_at = state.resume_at
    shared = isinstance(state.abort_error, SharedAbortError)
    if streak > 1 and not shared:  # the first retry is immediate; later ones back off
        resume_at = event.now + _backoff(streak - 1, policy)
    actions.insert(0, Aborted("spanning" if shared else "abortable_error", txn, streak, cause))
    phase = Phase.POSITIONING
    if policy.renew_after_abort:
        phase = Phase.INITIALISING
        actions += [CloseProducer(), StartInit(replacing=True)]
    else:
        actions.append(LookupPosition())
    return replace(state, phase=phase, txn=None, abort_streak=streak,
                   isolation=isolation, refused=refused, suspects=suspects, failures=(),
                   abort_error=None, resume_at=resume_at), actions


def abort_failed(state: PartitionState, event: AbortFailed, policy: Policy) -> Step:
    if state.phase is not Phase.ABORTING:
        return ignored(state)
    if isinstance(event.error, FencedError):
        # The coordinator had already aborted it (timed out) or another owner fenced
        # us. Either way the transaction is gone; the position comes from Kafka.
        return _fence(state, event.error, event.now, policy)
    if isinstance(event.error, RetriableError):
        # The abort did not finish by its deadline: the producer is stuck. Replace it;
        # the next init_transactions of its id aborts the transaction for us.
        return _fence(state, event.error, event.now, policy)
    if policy.renew_after_abort:
        # The producer is unusable (e.g. INVALID_TXN_STATE on the abort after the
        # coordinator's broker dies while outputs time out:
        # docs/journal/2026-11-24-soak-30-minutes.md). Nobody else
        # claimed the id, so no fence to wait out: a new producer's init_transactions
        # aborts what is open, exactly as a restart of the replica would, without the
        # restart. Counted as an abort: a producer that keeps failing so still fails
        # the replica after ``max_abort_streak``.
        return abort_done(replace(state, abort_error=event.error), AbortDone((), event.now),
                           policy)
    return state, [Fail(event.error)]


def poisoned(state: PartitionState, event: Poisoned, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE:
        return ignored(state)
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


def call_stuck(state: PartitionState, event: CallStuck, policy: Policy) -> Step:
    """Treated as a fence: whatever the stuck call did, the transaction never
    completes under this producer. A new producer takes over after a session
    time-out if the partition is still ours; its init_transactions completes or
    aborts what was open, and the position then comes from Kafka."""
    if state.phase not in (Phase.COMMITTING, Phase.ABORTING):
        return ignored(state)
    txn = state.txn
    return replace(state, phase=Phase.FENCED, fenced_at=event.now, txn=None, failures=(),
                   abort_error=None, reposition_after_commit=False, commit_uncertain=False,
                   pauses=state.pauses - {Pause.BACKLOG, Pause.LOOKUP}), [
        DropHeld(), DropProducer(),
        Fenced(txn, True, f"a {state.phase.value} call on the producer did not return in "
                          f"{policy.stuck_after_s:.0f} s")]


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
            return DeniedError(Where("produce"), failure.error())
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
