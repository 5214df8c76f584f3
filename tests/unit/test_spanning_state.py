"""The two events of TXSTAGE_TRANSACTIONS=spanning in the partition state machine:
joining the replica's commit, and aborting with another partition (pure)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from service.errors import SharedAbortError, Where
from service.stage import machine as sm
from service.stage.machine import Pause, Phase
from tests.unit.test_partition_state import abortable, aborted, active, kinds, step


def shared() -> SharedAbortError:
    return SharedAbortError(Where("abort_transaction", "tid"),
                            KafkaError(KafkaError._STATE, "aborted for another partition"))


def test_a_partition_with_nothing_open_joins_a_commit_empty_and_holds_meanwhile() -> None:
    state = step(active(10), sm.Wrote(10, 15, 5, 1.0), sm.CommitDue(1.1),
                 sm.CommitDone(0.01, 1.2))[0]
    assert state.txn is None and state.committed == 15
    state, actions = step(state, sm.CommitDue(1.3, join=True))
    assert state.phase is Phase.COMMITTING and state.holding
    assert actions == [sm.StartCommit(sm.Txn(15, 15, 0, 1.3))]
    state, actions = step(state, sm.CommitDone(0.0, 1.4))
    assert state.phase is Phase.ACTIVE and state.txn is None and state.committed == 15
    assert kinds(actions) == ["DrainHeld"]  # no Committed: nothing of its own


def test_only_a_join_makes_a_partition_with_nothing_open_commit() -> None:
    state, actions = step(active(10), sm.CommitDue(1.0))
    assert state.phase is Phase.ACTIVE and actions == []


def test_an_empty_join_leaves_a_bisection_as_it_was() -> None:
    state = step(active(0, 8), sm.ProduceFailed(abortable(KafkaError.INVALID_RECORD), 1.0))[0]
    state = step(state, *aborted((), 1.0), sm.Positioned(0, 1.0))[0]
    isolation = state.isolation
    assert isolation is not None
    state = step(state, sm.CommitDue(2.0, join=True), sm.CommitDone(0.0, 2.1))[0]
    assert state.isolation == isolation


def test_another_partitions_abort_rewinds_this_one_without_counting_against_it() -> None:
    state = active(7, 3)
    for now in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):  # more than max_abort_streak
        state, actions = step(state, sm.SpanAborted(shared(), now))
        assert state.phase is Phase.ABORTING and "StartAbort" in kinds(actions)
        state, actions = step(state, sm.AbortDone((), now))
        assert state.phase is Phase.INITIALISING and state.abort_streak == 0
        assert [a.reason for a in actions if isinstance(a, sm.Aborted)] == ["spanning"]
        state = step(state, sm.InitDone(now), sm.Positioned(7, now),
                     sm.Wrote(7, 10, 3, now))[0]
        assert Pause.BACKOFF not in state.pauses


def test_a_positioning_partition_aborts_with_the_others_and_starts_again() -> None:
    state, _ = sm.assigned()
    state = step(state, sm.InitDone(1.0))[0]
    state, actions = step(state, sm.SpanAborted(shared(), 1.1))
    assert state.phase is Phase.ABORTING
    state, actions = step(state, sm.AbortDone((), 1.2))
    assert state.phase is Phase.INITIALISING and kinds(actions)[-2:] == [
        "CloseProducer", "StartInit"]


def test_a_committing_or_released_partition_ignores_another_partitions_abort() -> None:
    committing = step(active(0, 3), sm.CommitDue(1.0))[0]
    assert step(committing, sm.SpanAborted(shared(), 1.1)) == (committing, [])


def test_its_own_abort_still_counts_and_backs_off() -> None:
    state = active(7, 3)
    state = step(state, sm.ProduceFailed(abortable(), 1.0), *aborted((), 1.0),
                 sm.Positioned(7, 1.0), sm.Wrote(7, 10, 3, 1.0))[0]
    state = step(state, sm.ProduceFailed(abortable(), 2.0), *aborted((), 2.0),
                 sm.Positioned(7, 2.0))[0]
    assert state.abort_streak == 2 and Pause.BACKOFF in state.pauses
