"""The partition state machine as a table: (state, event) -> (state, actions).

Pure functions, so no mocks and no broker: each test walks a partition through the
events one fault (or two at once) produces and checks what the loop is told to do.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from confluent_kafka import KafkaError

from service.errors import (
    AbortableError,
    Failure,
    FatalError,
    FencedError,
    KafkaOperationError,
    PoisonRecordError,
    RetriableError,
    Where,
)
from service.stage import machine as sm
from service.stage.machine import Pause, Phase
from service.stage.machine.phases import LEGAL
from service.stage.machine.transitions import HANDLERS, IllegalTransition

POLICY = sm.Policy(commit_interval_s=0.1, commit_max_records=1000, max_abort_streak=4,
                   retry_backoff_s=1.0, max_backoff_s=30.0, max_record_attempts=3,
                   reclaim_after_s=6.0, transaction_timeout_s=2.0)
AT_LEAST_ONCE = replace(POLICY, renew_after_abort=False,  # one shared producer
                        commits_deferred=True)    # a commit seals a delivery window


def abortable(code: int = KafkaError._STATE, op: str = "produce") -> AbortableError:
    return AbortableError(Where(op, "tid", "in", 0), KafkaError(code, "x", txn_requires_abort=True))


def fenced(op: str = "abort_transaction") -> FencedError:
    return FencedError(Where(op, "tid", "in", 0), KafkaError(KafkaError._FENCED, "fenced",
                                                             fatal=True))


def refused_at(offset: int | None, code: int = KafkaError.INVALID_RECORD) -> Failure:
    return Failure(code, KafkaError(code).name(), "refused", offset)


def kinds(actions: list[sm.Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def step(state: sm.PartitionState, *events: sm.Event,
         policy: sm.Policy = POLICY) -> tuple[sm.PartitionState, list[sm.Action]]:
    actions: list[sm.Action] = []
    for event in events:
        state, actions = sm.transition(state, event, policy)
    return state, actions


def aborted(failures: tuple[Failure, ...], now: float) -> tuple[sm.Event, sm.Event]:
    """The abort ends, and the new producer that replaces the aborting one is ready."""
    return sm.AbortDone(failures, now), sm.InitDone(now)


def active(first: int = 0, records: int = 0, now: float = 0.0) -> sm.PartitionState:
    """A partition that initialised, was positioned at ``first`` and wrote ``records``."""
    state, _ = sm.assigned()
    state, _ = step(state, sm.InitDone(now), sm.Positioned(first, now))
    if records:
        state, _ = step(state, sm.Wrote(first, first + records, records, now))
    return state


# ------------------------------------------------------------------ the happy path


def test_a_new_partition_fetches_only_after_init_and_the_committed_offset() -> None:
    state, actions = sm.assigned()
    assert state.phase is Phase.INITIALISING and state.paused
    assert kinds(actions) == ["PausePartition", "StartInit"]
    state, actions = step(state, sm.InitDone(1.0))
    assert state.phase is Phase.POSITIONING and state.paused
    assert kinds(actions) == ["LookupPosition"]
    state, actions = step(state, sm.Positioned(42, 1.1))
    assert state.phase is Phase.ACTIVE and not state.paused
    assert actions == [sm.Seek(42), sm.ResumePartition()]


def test_records_open_a_transaction_that_commits_when_due() -> None:
    state = active(10)
    state, _ = step(state, sm.Wrote(10, 15, 5, 1.0), sm.Wrote(15, 20, 5, 1.05))
    assert state.txn == sm.Txn(10, 20, 10, 1.0)
    assert not state.due(1.05, POLICY) and state.due(1.1, POLICY)
    state, actions = step(state, sm.CommitDue(1.1))
    assert state.phase is Phase.COMMITTING and state.holding and not state.paused
    assert actions == [sm.StartCommit(sm.Txn(10, 20, 10, 1.0))]
    state, actions = step(state, sm.CommitDone(0.02, 1.2))
    assert state.phase is Phase.ACTIVE and state.txn is None
    assert kinds(actions) == ["Committed", "DrainHeld"]


def test_a_transaction_keeps_its_first_and_last_input_timestamps_for_end_to_end_latency(
        ) -> None:
    state, _ = step(active(10), sm.Wrote(10, 15, 5, 1.0, 1_000, 1_400),
                    sm.Wrote(15, 20, 5, 1.05, 1_500, 1_900))
    assert state.txn is not None
    assert (state.txn.first_ts_ms, state.txn.last_ts_ms) == (1_000, 1_900)
    _, actions = step(state, sm.CommitDue(1.1), sm.CommitDone(0.02, 1.2))
    [committed] = [a for a in actions if isinstance(a, sm.Committed)]
    assert (committed.txn.first_ts_ms, committed.txn.last_ts_ms) == (1_000, 1_900)


def test_a_slow_commit_with_too_many_held_records_pauses_until_they_are_drained() -> None:
    # Resumed at the commit's end, a partition whose drain processed a few records
    # before its next commit fetched a batch a commit and held its whole lag.
    state, _ = step(active(0, 5), sm.CommitDue(1.0))
    state, actions = step(state, sm.BacklogFull())
    assert Pause.BACKLOG in state.pause_reasons and actions == [sm.PausePartition()]
    state, actions = step(state, sm.CommitDone(0.5, 1.5))
    assert kinds(actions) == ["Committed", "DrainHeld"]
    assert Pause.BACKLOG in state.pause_reasons
    state, actions = step(state, sm.BacklogDrained())
    assert Pause.BACKLOG not in state.pause_reasons and actions == [sm.ResumePartition()]


def test_a_commit_that_repositions_drops_the_held_records_and_their_pause() -> None:
    state, _ = step(active(0, 5), sm.CommitDue(1.0), sm.BacklogFull())
    state = replace(state, reposition_after_commit=True)
    state, actions = step(state, sm.CommitDone(0.5, 1.5))
    assert "DropHeld" in kinds(actions) and Pause.BACKLOG not in state.pause_reasons


def test_records_handed_back_past_the_limits_pause_an_active_partition_until_drained() -> None:
    state, actions = step(active(0, 5), sm.BacklogFull())
    assert state.phase is Phase.ACTIVE and actions == [sm.PausePartition()]
    assert not state.holding, "what it holds is drained, not held again"
    state, actions = step(state, sm.BacklogDrained())
    assert Pause.BACKLOG not in state.pause_reasons and actions == [sm.ResumePartition()]


def test_a_drained_backlog_does_not_resume_a_partition_paused_for_another_reason() -> None:
    state, _ = step(active(0, 5), sm.CommitDue(1.0), sm.BacklogFull())
    state, actions = step(state, sm.BacklogDrained())  # committing: the commit resumes it
    assert Pause.BACKLOG in state.pause_reasons and actions == []


# ------------------------------------------------------------------ one fault


def test_an_abortable_produce_aborts_renews_the_producer_and_resumes_from_kafka() -> None:
    """The new producer's init_transactions bumps the epoch: a request of the aborted
    transaction still in flight is fenced instead of joining the next transaction."""
    state, actions = step(active(0, 5), sm.ProduceFailed(abortable(), 1.0))
    assert state.phase is Phase.ABORTING and state.paused
    assert kinds(actions) == ["PausePartition", "DropHeld", "StartAbort"]
    state, actions = step(state, sm.AbortDone((), 1.1))
    assert state.phase is Phase.INITIALISING and state.abort_streak == 1 and state.paused
    assert kinds(actions) == ["Aborted", "CloseProducer", "StartInit"]
    state, actions = step(state, sm.InitDone(1.15))
    assert state.phase is Phase.POSITIONING and kinds(actions) == ["LookupPosition"]
    state, actions = step(state, sm.Positioned(0, 1.2))
    assert actions == [sm.Seek(0), sm.ResumePartition()]


def test_at_least_once_keeps_its_shared_producer_after_an_abort() -> None:
    state, _ = step(active(0, 5), sm.DeliveryFailed((), 1.0), policy=AT_LEAST_ONCE)
    state, actions = step(state, sm.AbortDone((), 1.1), policy=AT_LEAST_ONCE)
    assert state.phase is Phase.POSITIONING and kinds(actions) == ["Aborted", "LookupPosition"]


def test_aborts_in_a_row_back_off_then_fail_naming_the_offsets() -> None:
    state = active(7, 3)
    for attempt in range(1, POLICY.max_abort_streak):
        state, _ = step(state, sm.ProduceFailed(abortable(), 10.0), *aborted((), 10.0))
        state, actions = step(state, sm.Positioned(7, 10.0))
        assert (Pause.BACKOFF in state.pauses) == (attempt > 1)  # the first retry is at once
        state, _ = step(state, sm.Tick(100.0), sm.Wrote(7, 10, 3, 100.0))
    state, actions = step(state, sm.ProduceFailed(abortable(), 200.0), sm.AbortDone((), 200.0))
    [fail] = actions
    assert isinstance(fail, sm.Fail)
    assert "4 aborts in a row; the last covered input offsets 7..9" in fail.error.__notes__[0]


def test_a_commit_that_timed_out_is_never_aborted() -> None:
    timed_out = RetriableError(Where("commit_transaction"),
                               KafkaError(KafkaError._TIMED_OUT, "t", retriable=True))
    state, _ = step(active(0, 5), sm.CommitDue(1.0))
    state, actions = step(state, sm.CommitFailed(timed_out, (), 2.0))
    assert state.commit_uncertain and kinds(actions) == ["Fail"]
    state, actions = step(state, sm.Released(True, 3.0, "shutdown"))
    assert "StartAbort" not in kinds(actions) and "Finish" not in kinds(actions)
    assert kinds(actions) == ["DropHeld", "Abandon"]


def test_offsets_that_could_not_be_sent_by_the_deadline_replace_the_producer() -> None:
    """send_offsets_to_transaction still pending at its deadline: nothing committed,
    and the producer refuses other calls while it is pending; so no abort (it would
    get _CONFLICT) and no exit: close it and reclaim, from Kafka's committed offset."""
    timed_out = RetriableError(Where("send_offsets_to_transaction"),
                               KafkaError(KafkaError._TIMED_OUT, "t", retriable=True))
    state, _ = step(active(0, 5), sm.CommitDue(1.0))
    state, actions = step(state, sm.CommitFailed(timed_out, (), 95.0))
    assert state.phase is Phase.FENCED and state.txn is None and not state.commit_uncertain
    assert "CloseProducer" in kinds(actions) and "Fail" not in kinds(actions)
    state, actions = step(state, sm.Tick(95.0 + POLICY.reclaim_after_s))
    assert state.phase is Phase.INITIALISING and "StartInit" in kinds(actions)


def test_an_abort_that_could_not_finish_by_its_deadline_replaces_the_producer() -> None:
    timed_out = RetriableError(Where("abort_transaction"),
                               KafkaError(KafkaError._TIMED_OUT, "t", retriable=True))
    state, _ = step(active(0, 5), sm.ProduceFailed(abortable(), 1.0))
    state, actions = step(state, sm.AbortFailed(timed_out, 95.0))
    assert state.phase is Phase.FENCED and "CloseProducer" in kinds(actions)
    assert "Fail" not in kinds(actions)


@pytest.mark.parametrize("stuck_in", ["committing", "aborting"])
def test_a_call_that_never_returns_drops_its_producer_and_reclaims(stuck_in: str) -> None:
    """librdkafka#5456: send_offsets_to_transaction can ignore its timeout after a
    broker restart. The producer is dropped unclosed, and replaced a session
    time-out later; its init_transactions settles what was open."""
    state = active(0, 5)
    if stuck_in == "committing":
        state, _ = step(state, sm.CommitDue(1.0))
    else:
        state, _ = step(state, sm.ProduceFailed(abortable(), 1.0))
    state, actions = step(state, sm.CallStuck(200.0))
    assert state.phase is Phase.FENCED and state.txn is None
    assert kinds(actions)[-3:] == ["DropHeld", "DropProducer", "Fenced"] and state.paused
    assert "CloseProducer" not in kinds(actions) and "StartAbort" not in kinds(actions)
    state, actions = step(state, sm.Tick(200.0 + POLICY.reclaim_after_s))
    assert kinds(actions) == ["Reclaiming", "StartInit"]
    state, actions = step(state, sm.InitDone(207.0))
    assert kinds(actions) == ["LookupPosition"]


def test_a_call_reported_stuck_after_it_returned_changes_nothing() -> None:
    state = active(0, 5)
    assert step(state, sm.CallStuck(200.0))[1] == []


def test_a_fatal_error_fails_the_replica() -> None:
    fatal = FatalError(Where("produce"), KafkaError(KafkaError._FATAL, "f", fatal=True))
    _, actions = step(active(0, 1), sm.ProduceFailed(fatal, 1.0))
    assert actions == [sm.Fail(fatal)]


def test_poison_without_dead_letter_topic_commits_the_prefix_then_retries_from_kafka() -> None:
    poison = PoisonRecordError("in", 0, 5, ValueError("bad"))
    state, actions = step(active(0, 5), sm.Poisoned(poison, 1.0))
    assert state.phase is Phase.COMMITTING and state.reposition_after_commit
    assert Pause.BACKOFF in state.pauses
    assert kinds(actions) == ["PausePartition", "Aborted", "StartCommit"]
    state, actions = step(state, sm.CommitDone(0.01, 1.1))
    assert state.phase is Phase.POSITIONING
    assert kinds(actions) == ["Committed", "DropHeld", "LookupPosition"]
    assert actions[-1] == sm.LookupPosition(after_commit=True)  # a stable read only
    state, actions = step(state, sm.Positioned(5, 1.2))
    assert actions == [sm.Seek(5)] and state.paused  # still backing off
    state, actions = step(state, sm.Tick(2.5))
    assert actions == [sm.ResumePartition()]


def test_poison_right_after_a_commit_resumes_from_a_stable_read_only() -> None:
    # The commit ended (CommitDone) and the first record drained after it is poison:
    # no transaction is open, but the commit's offsets may not be applied yet, so a
    # plain read could give the offset before it (its records would run twice).
    state, _ = step(active(0, 5), sm.CommitDue(0.2), sm.CommitDone(0.01, 0.3))
    assert state.phase is Phase.ACTIVE and state.txn is None
    poison = PoisonRecordError("in", 0, 5, ValueError("bad"))
    state, actions = step(state, sm.Poisoned(poison, 0.3))
    assert state.phase is Phase.POSITIONING
    assert actions[-1] == sm.LookupPosition(after_commit=True)


def test_an_output_refused_by_produce_itself_names_its_record() -> None:
    # MSG_SIZE_TOO_LARGE from produce() (over the producer's message.max.bytes): the
    # call names its record, which is sent once more, then dead-lettered.
    too_large = AbortableError(Where("produce", "tid", "in", 0, 3),
                               KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
    state, _ = step(active(0, 3), sm.ProduceFailed(too_large, 1.0), *aborted((), 1.1))
    assert dict(state.suspects) == {3: str(too_large)}
    state, _ = step(state, sm.Positioned(0, 1.2), sm.Wrote(0, 3, 3, 1.2),
                    sm.ProduceFailed(too_large, 1.3), *aborted((), 1.4))
    assert set(state.refused) == {3} and state.isolation is None


def test_poison_fails_after_its_attempts() -> None:
    poison = PoisonRecordError("in", 0, 0, ValueError("bad"))
    state = active(0)
    for _ in range(POLICY.max_record_attempts - 1):
        state, _ = step(state, sm.Poisoned(poison, 1.0), sm.Positioned(0, 1.0), sm.Tick(99.0))
    _, actions = step(state, sm.Poisoned(poison, 100.0))
    assert kinds(actions) == ["Aborted", "Fail"] and actions[-1] == sm.Fail(poison)


# ------------------------------------------------------------------ refused outputs


def test_a_refused_output_named_twice_by_its_delivery_reports_is_dead_lettered() -> None:
    """Named once, the record is sent again (a refusal may not repeat); named again,
    it is dead-lettered. No bisection, no one-record transactions."""
    state, _ = step(active(40, 5), sm.ProduceFailed(abortable(), 1.0))
    state, actions = step(state, sm.AbortDone((refused_at(42), refused_at(
        43, KafkaError._INVALID_DIFFERENT_RECORD)), 1.1))
    assert dict(state.suspects) == {42: "INVALID_RECORD: refused"} and not state.refused
    assert kinds(actions) == ["Aborted", "CloseProducer", "StartInit"]
    state, _ = step(state, sm.InitDone(1.2), sm.Positioned(40, 1.2), sm.Wrote(40, 45, 5, 1.2),
                    sm.ProduceFailed(abortable(), 1.3))
    state, actions = step(state, sm.AbortDone((refused_at(42),), 1.4))
    assert dict(state.refused) == {42: "INVALID_RECORD: refused"} and not state.suspects
    assert state.abort_streak == 0, "finding the record is progress, not a failed retry"
    assert kinds(actions) == ["Aborted", "RecordRefused", "CloseProducer", "StartInit"]


def test_a_refusal_that_does_not_repeat_costs_a_retry_not_the_record() -> None:
    state, _ = step(active(40, 5), sm.ProduceFailed(abortable(), 1.0),
                    *aborted((refused_at(42),), 1.1), sm.Positioned(40, 1.2),
                    sm.Wrote(40, 45, 5, 1.2), sm.CommitDue(1.3), sm.CommitDone(0.1, 1.4))
    assert not state.refused and state.phase is Phase.ACTIVE


def test_refusal_while_committing_is_found_as_well() -> None:
    state, _ = step(active(40, 5), sm.CommitDue(1.0))
    state, _ = step(state, sm.CommitFailed(abortable(KafkaError.INVALID_RECORD,
                                                     "commit_transaction"),
                                           (refused_at(44),), 1.1))
    state, _ = step(state, sm.AbortDone((), 1.2))
    assert set(state.suspects) == {44}, "named once: retried before it is dead-lettered"


def test_an_unattributed_refusal_is_found_by_bisection() -> None:
    """Ten records, the sixth (offset 105) refused, reports naming no record: each
    transaction holds half of what is left, so the record is found in a few aborts."""
    culprit, first, records = 105, 100, 10
    state = active(first, records)
    aborts = 0
    position = first
    found: list[int] = []
    for _ in range(20):
        if state.phase is Phase.ACTIVE and state.txn is None:
            room = state.room()
            take = records - (position - first) if room is None else min(
                room, records - (position - first))
            state, _ = step(state, sm.Wrote(position, position + take, take, 1.0))
        txn = state.txn
        assert txn is not None
        if txn.first <= culprit < txn.next and culprit not in state.refused:
            aborts += 1
            state, _ = step(state, sm.ProduceFailed(abortable(KafkaError.MSG_SIZE_TOO_LARGE), 1.0))
            state, actions = step(state, sm.AbortDone(
                (refused_at(None, KafkaError.MSG_SIZE_TOO_LARGE),), 1.0))
            found += [a.offset for a in actions if isinstance(a, sm.RecordRefused)]
            state, _ = step(state, sm.InitDone(1.0), sm.Positioned(txn.first, 1.0))
            position = txn.first
        else:
            state, _ = step(state, sm.CommitDue(1.0), sm.CommitDone(0.01, 1.0))
            position = txn.next
            if position >= first + records:
                break
    assert found == [culprit]
    assert aborts <= 5 and state.isolation is None and state.abort_streak == 0


def test_a_refused_dead_letter_fails_instead_of_looping() -> None:
    state, _ = step(active(42, 1), sm.ProduceFailed(abortable(), 1.0),
                    *aborted((refused_at(42),), 1.0), sm.Positioned(42, 1.0),
                    sm.Wrote(42, 43, 1, 1.0), sm.ProduceFailed(abortable(), 2.0))
    _, actions = step(state, sm.AbortDone((refused_at(42),), 2.0))
    assert kinds(actions) == ["Fail"]
    assert "dead letter of offset 42 was refused" in actions[0].error.__notes__[0]  # type: ignore[attr-defined]


# ------------------------------------------------------------------ two faults at once


def test_abortable_then_fenced_resumes_from_kafka_not_from_memory() -> None:
    """Defect 1: the abort after a refused output gets _FENCED (the coordinator timed
    the transaction out). The partition must neither keep its in-memory position nor
    commit past the aborted inputs: it waits, re-initialises, and asks Kafka."""
    state = active(0, 6, now=0.0)
    state, _ = step(state, sm.ProduceFailed(abortable(), 6.0))
    state, actions = step(state, sm.AbortFailed(fenced(), 6.1))
    assert state.phase is Phase.FENCED and state.txn is None
    assert kinds(actions) == ["DropHeld", "CloseProducer", "Fenced"]
    assert actions[-1] == sm.Fenced(sm.Txn(0, 6, 6, 0.0), True, str(fenced()))
    state, actions = step(state, sm.Tick(10.0))
    assert actions == [] and state.phase is Phase.FENCED
    state, actions = step(state, sm.Tick(12.2))
    assert state.phase is Phase.INITIALISING and kinds(actions) == ["Reclaiming", "StartInit"]
    state, actions = step(state, sm.InitDone(12.5))
    assert actions == [sm.LookupPosition()]
    state, actions = step(state, sm.Positioned(0, 12.6))
    assert actions[0] == sm.Seek(0), "the committed offset, not the aborted transaction's end"


def test_fenced_on_commit_closes_the_producer_and_drops_held_records() -> None:
    state, _ = step(active(0, 5), sm.CommitDue(1.0))
    state, actions = step(state, sm.CommitFailed(fenced("commit_transaction"), (), 1.1))
    assert state.phase is Phase.FENCED
    assert kinds(actions) == ["PausePartition", "DropHeld", "CloseProducer", "Fenced"]


def test_seed_2026_a_fatal_error_on_abort_renews_the_producer_instead_of_failing() -> None:
    """Soak seed 2026: outputs timed out while the coordinator's broker died, and
    abort_transaction answered INVALID_TXN_STATE (fatal); the replica exited 1. A new
    producer's init_transactions aborts what is open, as a restart would."""
    invalid = FatalError(Where("abort_transaction", "tid", "in", 0),
                         KafkaError(KafkaError.INVALID_TXN_STATE, "invalid", fatal=True))
    state, _ = step(active(0, 5), sm.ProduceFailed(abortable(), 1.0))
    state, actions = step(state, sm.AbortFailed(invalid, 1.1))
    assert state.phase is Phase.INITIALISING and state.abort_streak == 1
    assert kinds(actions) == ["Aborted", "CloseProducer", "StartInit"]
    assert "INVALID_TXN_STATE" in actions[0].cause  # type: ignore[union-attr]
    for _ in range(POLICY.max_abort_streak - 2):
        state, _ = step(state, sm.InitDone(2.0), sm.Positioned(0, 2.0), sm.Tick(99.0),
                        sm.Wrote(0, 5, 5, 99.0), sm.ProduceFailed(abortable(), 99.0),
                        sm.AbortFailed(invalid, 99.0))
        assert state.phase is Phase.INITIALISING
    state, _ = step(state, sm.InitDone(2.0), sm.Positioned(0, 2.0), sm.Tick(199.0),
                    sm.Wrote(0, 5, 5, 199.0), sm.ProduceFailed(abortable(), 199.0))
    _, actions = step(state, sm.AbortFailed(invalid, 199.0))
    assert kinds(actions) == ["Fail"], "a producer that keeps failing still fails the replica"


def test_at_least_once_has_no_producer_to_renew_on_a_fatal_abort() -> None:
    invalid = FatalError(Where("abort_transaction"), KafkaError(KafkaError._FATAL, "x", fatal=True))
    state, _ = step(active(0, 5), sm.DeliveryFailed((), 1.0), policy=AT_LEAST_ONCE)
    _, actions = step(state, sm.AbortFailed(invalid, 1.1), policy=AT_LEAST_ONCE)
    assert kinds(actions) == ["Fail"]


def test_revoke_while_aborting_abandons_the_abort_to_finish_alone() -> None:
    state, _ = step(active(0, 5), sm.ProduceFailed(abortable(), 1.0))
    state, actions = step(state, sm.Released(False, 1.1))
    assert state.phase is Phase.RELEASED and kinds(actions) == ["DropHeld", "Abandon"]
    state, actions = step(state, sm.AbortDone((), 1.2))
    assert actions == [] and state.phase is Phase.RELEASED, "a late completion changes nothing"


def test_revoke_after_the_abort_ended_closes_without_committing() -> None:
    state, _ = step(active(0, 5), sm.ProduceFailed(abortable(), 1.0), *aborted((), 1.1))
    _, actions = step(state, sm.Released(False, 1.2))
    assert actions == [sm.DropHeld(), sm.Finish(None, False, "revoked")]


def test_revoke_while_the_producer_is_renewed_after_an_abort_abandons_the_init() -> None:
    state, _ = step(active(0, 5), sm.ProduceFailed(abortable(), 1.0), sm.AbortDone((), 1.1))
    state, actions = step(state, sm.Released(False, 1.2))
    assert state.phase is Phase.RELEASED and kinds(actions) == ["DropHeld", "Abandon"]


def test_revoke_commits_a_healthy_transaction_and_lost_never_does() -> None:
    state = active(0, 5, now=1.0)
    _, revoked = step(state, sm.Released(False, 1.1))
    _, lost = step(state, sm.Released(True, 1.1, "lost"))
    assert revoked[-1] == sm.Finish(sm.Txn(0, 5, 5, 1.0), True, "revoked")
    assert lost[-1] == sm.Finish(sm.Txn(0, 5, 5, 1.0), False, "lost")



def test_the_release_deadline_reaches_the_committer_with_finish() -> None:
    # What the committer waits for on the loop thread (at-least-once: its outputs in
    # flight) must end with the release, not after a wait of its own per partition.
    _, actions = step(active(0, 5, now=1.0), sm.Released(False, 1.1, "revoked", 11.1))
    assert actions[-1] == sm.Finish(sm.Txn(0, 5, 5, 1.0), True, "revoked", 11.1)

def test_at_least_once_a_healthy_release_commits_with_no_window_open() -> None:
    """A window sealed just before a revoke or SIGTERM leaves no ``txn``, its offsets
    waiting to be delivered and committed: told to commit nothing, the committer
    dropped them and the next owner redid them. Exactly-once has nothing open then."""
    sealed, _ = step(active(0, 5), sm.CommitDue(1.0), sm.CommitDone(-1.0, 1.0),
                     policy=AT_LEAST_ONCE)
    assert sealed.phase is Phase.ACTIVE and sealed.txn is None
    _, stopped = step(sealed, sm.Released(False, 1.1, "shutdown"), policy=AT_LEAST_ONCE)
    _, lost = step(sealed, sm.Released(True, 1.1, "lost"), policy=AT_LEAST_ONCE)
    assert stopped == [sm.DropHeld(), sm.Finish(None, True, "shutdown")]
    assert lost == [sm.DropHeld(), sm.Finish(None, False, "lost")]
    poison = PoisonRecordError("in", 0, 5, ValueError("bad"))  # the prefix sealed, positioning
    positioning, _ = step(active(0, 5), sm.Poisoned(poison, 1.0), sm.CommitDone(-1.0, 1.0),
                          policy=AT_LEAST_ONCE)
    assert positioning.phase is Phase.POSITIONING
    _, revoked = step(positioning, sm.Released(False, 1.1), policy=AT_LEAST_ONCE)
    assert revoked == [sm.DropHeld(), sm.Finish(None, True, "revoked")]
    committed, _ = step(active(0, 5), sm.CommitDue(1.0), sm.CommitDone(0.1, 1.1))
    _, exactly_once = step(committed, sm.Released(False, 1.2, "shutdown"))
    assert exactly_once == [sm.DropHeld(), sm.Finish(None, False, "shutdown")]


def test_a_rebalance_during_a_commit_lets_it_end_before_releasing() -> None:
    """The listener waits for the running commit; its completion then arrives before
    Released, so the committed transaction is not aborted or committed twice."""
    state, _ = step(active(0, 5), sm.CommitDue(1.0), sm.CommitDone(0.1, 1.1))
    _, actions = step(state, sm.Released(False, 1.2))
    assert actions == [sm.DropHeld(), sm.Finish(None, False, "revoked")]


def test_fence_while_backing_off_resumes_only_when_every_reason_is_gone() -> None:
    poison = PoisonRecordError("in", 0, 3, ValueError("bad"))
    state, _ = step(active(0, 3), sm.Poisoned(poison, 1.0))  # commit + back off
    state, actions = step(state, sm.CommitFailed(fenced("commit_transaction"), (), 1.1))
    assert state.phase is Phase.FENCED
    assert state.pause_reasons == {Pause.FENCED, Pause.BACKOFF}
    state, actions = step(state, sm.Tick(3.0))  # backoff over, still fenced
    assert actions == [] and state.pause_reasons == {Pause.FENCED}
    state, _ = step(state, sm.Tick(8.0), sm.InitDone(8.1))
    state, actions = step(state, sm.Positioned(0, 8.2))
    assert actions == [sm.Seek(0), sm.ResumePartition()]


def test_a_fence_on_init_waits_like_any_fence() -> None:
    state, _ = sm.assigned()
    state, actions = step(state, sm.InitFailed(fenced("init_transactions"), 1.0))
    assert state.phase is Phase.FENCED and kinds(actions) == ["Fenced"]


def test_an_init_that_times_out_starts_a_fresh_producer_instead_of_failing() -> None:
    # After a 17 s broker freeze, replacement producers stayed "all brokers down"
    # past the 90 s deadline and the replica exited 1 (test_compound_faults).
    state, _ = sm.assigned()
    timed_out = RetriableError(Where("init_transactions", "tid", "in", 0),
                               KafkaError(KafkaError._TIMED_OUT, "timed out"))
    state, actions = step(state, sm.InitFailed(timed_out, 1.0))
    assert state.phase is Phase.INITIALISING and actions == [sm.StartInit(replacing=True)]
    state, actions = step(state, sm.InitFailed(KafkaOperationError(
        Where("init_transactions"), KafkaError(KafkaError.INVALID_CONFIG, "bad")), 2.0))
    assert kinds(actions) == ["Fail"]


def test_at_least_once_delivery_failure_rewinds_and_dead_letters_the_named_record() -> None:
    state = active(0, 50)
    state, actions = step(state, sm.DeliveryFailed((refused_at(17),), 1.0), policy=AT_LEAST_ONCE)
    assert kinds(actions) == ["PausePartition", "DropHeld", "StartAbort"]
    assert actions[-1] == sm.StartAbort(None)
    state, _ = step(state, sm.AbortDone((), 1.0), policy=AT_LEAST_ONCE)
    assert set(state.suspects) == {17} and state.phase is Phase.POSITIONING
    state, _ = step(state, sm.Positioned(0, 1.1), sm.Wrote(0, 50, 50, 1.1),
                    sm.DeliveryFailed((refused_at(17),), 2.0), sm.AbortDone((), 2.0),
                    policy=AT_LEAST_ONCE)
    assert set(state.refused) == {17}


def test_at_least_once_unnamed_refusal_writes_its_records_again_named_then_dead_letters() -> None:
    """A flowing partition writes unnamed: the refusal names no record, so the records
    up to the failed window's end are written again named (not flowing) until a
    window passes it; then the repeat names the record and it is dead-lettered."""
    state = active(0, 50)
    assert state.flowing
    state, _ = step(state, sm.DeliveryFailed((refused_at(None),), 1.0, through=50),
                    sm.AbortDone((), 1.0), policy=AT_LEAST_ONCE)
    assert state.name_until == 50 and not state.refused and not state.suspects
    assert state.abort_streak == 0, "a refusal is not a streak"
    state, _ = step(state, sm.Positioned(0, 1.1), policy=AT_LEAST_ONCE)
    assert state.name_until == 50 and not state.flowing
    state, _ = step(state, sm.Wrote(0, 50, 50, 1.1), sm.DeliveryFailed((refused_at(17),), 2.0),
                    sm.AbortDone((), 2.0), sm.Positioned(0, 2.1), sm.Wrote(0, 50, 50, 2.1),
                    sm.DeliveryFailed((refused_at(17),), 3.0), sm.AbortDone((), 3.0),
                    policy=AT_LEAST_ONCE)
    assert set(state.refused) == {17}
    state, _ = step(state, sm.Positioned(0, 3.1), sm.Wrote(0, 60, 60, 3.1), sm.CommitDue(3.2),
                    sm.CommitDone(-1.0, 3.2), policy=AT_LEAST_ONCE)
    assert state.name_until is None, "a window past it was written named"


def test_at_least_once_named_until_is_settled_by_the_committed_offset() -> None:
    state, _ = step(active(0, 50), sm.DeliveryFailed((refused_at(None),), 1.0, through=50),
                    sm.AbortDone((), 1.0), policy=AT_LEAST_ONCE)
    state, _ = step(state, sm.Positioned(50, 1.1), policy=AT_LEAST_ONCE)
    assert state.name_until is None and state.flowing


def test_at_least_once_delivery_failure_while_positioning_rewinds_again() -> None:
    """A poison retry seals the good prefix and positions at once; the prefix's
    outputs may still fail then. Ignored, the committer kept the failure blamed and
    the failed window at the head of its queue: the partition never committed again."""
    poison = PoisonRecordError("in", 0, 5, ValueError("bad"))
    state, _ = step(active(0, 5), sm.Poisoned(poison, 1.0), sm.CommitDone(-1.0, 1.0),
                    policy=AT_LEAST_ONCE)
    assert state.phase is Phase.POSITIONING
    timed_out = Failure(KafkaError._MSG_TIMED_OUT, "_MSG_TIMED_OUT", "timed out", None)
    state, actions = step(state, sm.DeliveryFailed((timed_out,), 1.2, through=5),
                          policy=AT_LEAST_ONCE)
    assert state.phase is Phase.ABORTING and actions == [sm.DropHeld(), sm.StartAbort(None)]
    state, actions = step(state, sm.AbortDone((), 1.2), policy=AT_LEAST_ONCE)
    assert state.phase is Phase.POSITIONING and kinds(actions) == ["Aborted", "LookupPosition"]
    assert state.name_until == 5 and state.poison_offset == 5 and Pause.BACKOFF in state.pauses


def test_an_unknown_output_topic_holds_the_partition_until_it_is_looked_up() -> None:
    state, actions = step(active(0, 2), sm.TopicUnknown("elsewhere"))
    assert state.holding and actions == [sm.PausePartition(), sm.LookupTopic("elsewhere")]
    state, actions = step(state, sm.CommitDue(5.0))  # a commit may still come due
    assert state.phase is Phase.COMMITTING
    state, actions = step(state, sm.CommitDone(0.1, 5.1))
    assert state.holding, "still waiting for the lookup"
    state, actions = step(state, sm.TopicResolved("elsewhere"))
    assert actions == [sm.DrainHeld(), sm.ResumePartition()]


@pytest.mark.parametrize("event", [
    sm.CommitDone(0.1, 1.0), sm.AbortDone((), 1.0), sm.InitDone(1.0), sm.Positioned(3, 1.0),
    sm.CommitFailed(abortable(), (), 1.0), sm.AbortFailed(fenced(), 1.0),
])
def test_late_completions_after_release_change_nothing(event: sm.Event) -> None:
    state, _ = step(active(0, 1), sm.Released(True, 0.5, "lost"))
    assert step(state, event) == (state, [])


def test_every_event_kind_has_a_handler() -> None:
    events = sm.Event.__args__  # type: ignore[attr-defined]
    for kind in events:
        assert kind in HANDLERS, kind


def test_a_phase_change_the_legal_table_does_not_list_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # FENCED goes on only through a new producer (INITIALISING): a handler that put a
    # fenced partition straight back to ACTIVE would publish under a zombie.
    def to_active(state: sm.PartitionState, event: sm.Tick, policy: sm.Policy) -> sm.Step:
        return replace(state, phase=sm.Phase.ACTIVE), []

    monkeypatch.setitem(HANDLERS, sm.Tick, to_active)  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition, match="fenced -> active"):
        sm.transition(sm.PartitionState(sm.Phase.FENCED), sm.Tick(0.0), POLICY)


def test_every_phase_has_its_legal_successors_listed() -> None:
    assert set(LEGAL) == set(sm.Phase)
    assert all(sm.Phase.RELEASED not in after for after in LEGAL.values())  # always allowed


def test_unknown_events_are_rejected() -> None:
    with pytest.raises(TypeError):
        sm.transition(active(), object(), POLICY)  # type: ignore[arg-type]


def test_group_moved_on_during_send_offsets_is_abortable_for_that_partition() -> None:
    from confluent_kafka import KafkaException

    from service.kafka.errors import translate
    for code in (KafkaError.STALE_MEMBER_EPOCH, KafkaError.ILLEGAL_GENERATION):
        error = translate(KafkaException(KafkaError(code, "moved on")),
                          Where("send_offsets_to_transaction", "tid", "in", 0))
        assert isinstance(error, AbortableError), code
    other = translate(KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, "x")),
                      Where("commit_offsets"))
    assert isinstance(other, KafkaOperationError) and not isinstance(other, AbortableError)


def test_an_output_the_acls_deny_fails_the_replica_after_the_abort_naming_the_permission() -> None:
    denied = refused_at(3, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    state, actions = step(active(0, 5), sm.DeliveryFailed((denied,), 1.0))
    assert kinds(actions)[-1] == "StartAbort"  # what is open is aborted first
    state, actions = step(state, sm.AbortDone((), 1.1))
    [fail] = actions
    assert isinstance(fail, sm.Fail)
    assert str(fail.error).startswith(
        "permission denied: WRITE on an output or dead-letter topic")


def test_only_a_partitions_first_producer_of_an_assignment_is_not_a_replacement() -> None:
    # The committer warms a first producer up (a metadata round trip before
    # init_transactions) and never a replacement, which follows cluster trouble.
    _, actions = sm.assigned()
    assert [a for a in actions if isinstance(a, sm.StartInit)] == [sm.StartInit(replacing=False)]
    _, actions = step(active(0, 5), sm.ProduceFailed(abortable(), 1.0), sm.AbortDone((), 1.1))
    assert [a for a in actions if isinstance(a, sm.StartInit)] == [sm.StartInit(replacing=True)]
    state, _ = step(active(0, 5), sm.ProduceFailed(fenced("produce"), 1.0))
    _, actions = step(state, sm.Tick(1.0 + POLICY.reclaim_after_s))
    assert [a for a in actions if isinstance(a, sm.StartInit)] == [sm.StartInit(replacing=True)]
