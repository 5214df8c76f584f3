"""Transitions of the healthy path: init, position, write, commit, tick, release."""

from __future__ import annotations

import math
from dataclasses import replace

from service.stage.machine.actions import (
    Abandon,
    Committed,
    DrainHeld,
    DropHeld,
    Finish,
    LookupPosition,
    LookupTopic,
    Reclaiming,
    Seek,
    StartCommit,
    StartInit,
    Step,
    ignored,
)
from service.stage.machine.events import (
    BacklogDrained,
    BacklogFull,
    CommitDone,
    CommitDue,
    InitDone,
    Positioned,
    ReachedEnd,
    Released,
    Tick,
    TopicResolved,
    TopicUnknown,
    Wrote,
)
from service.stage.machine.phases import Isolation, PartitionState, Pause, Phase, Policy, Txn


def wrote(state: PartitionState, event: Wrote, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE:
        return ignored(state)
    txn = state.txn
    if txn is None:
        txn = Txn(event.first, event.next, event.records, event.now, event.first_ts_ms,
                  event.last_ts_ms)
    elif not txn.records:  # opened by ReachedEnd: its first records
        txn = replace(txn, next=event.next, records=event.records,
                      first_ts_ms=event.first_ts_ms, last_ts_ms=event.last_ts_ms)
    else:
        txn = replace(txn, next=event.next, records=txn.records + event.records,
                      last_ts_ms=event.last_ts_ms)
    return replace(state, txn=txn), []


def init_done(state: PartitionState, event: InitDone, policy: Policy) -> Step:
    if state.phase is not Phase.INITIALISING:
        return ignored(state)
    return replace(state, phase=Phase.POSITIONING, fenced_at=None), [LookupPosition()]


def positioned(state: PartitionState, event: Positioned, policy: Policy) -> Step:
    if state.phase is not Phase.POSITIONING:
        return ignored(state)
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
    overrun = event.overrun  # one below the committed offset is settled: stale
    if overrun is not None and offset > overrun.offset:
        overrun = None
    return replace(state, phase=Phase.ACTIVE, txn=None, isolation=isolation, refused=refused,
                   name_until=name_until, suspects=suspects, pauses=pauses, failures=(),
                   abort_error=None, overrun=overrun, committed=offset), [Seek(offset)]


def commit_due(state: PartitionState, event: CommitDue, policy: Policy) -> Step:
    """Due, or (spanning) joining the replica's commit: with nothing open, an empty
    transaction at the committed offset joins it, so that the partition writes nothing
    into the replica's transaction while it commits."""
    txn = state.txn
    if state.phase is not Phase.ACTIVE or (txn is None and not event.join):
        return ignored(state)
    if txn is None:
        txn = Txn(state.committed, state.committed, 0, event.now)
    return replace(state, phase=Phase.COMMITTING, txn=txn), [StartCommit(txn)]


def commit_done(state: PartitionState, event: CommitDone, policy: Policy) -> Step:
    if state.phase is not Phase.COMMITTING or state.txn is None:
        return ignored(state)
    txn = state.txn
    if txn.empty:  # joined the replica's commit with nothing of its own (spanning)
        return replace(state, phase=Phase.ACTIVE, txn=None), [DrainHeld()]
    isolation = state.isolation
    if isolation is not None:
        remaining = isolation.remaining - txn.records
        isolation = None if txn.next >= isolation.until or remaining <= 0 else \
            Isolation(isolation.until, remaining, max(1, math.ceil(remaining / 2)))
    name_until = state.name_until
    if name_until is not None and txn.next >= name_until:
        name_until = None  # every record below it was written named
    poison = state.poison_offset
    overrun = state.overrun  # past it: flowing again (a rewind's Positioned brings it back)
    if overrun is not None and txn.next > overrun.offset:
        overrun = None
    # Refused offsets stay until Kafka's committed offset passes them (Positioned):
    # an at-least-once "commit" only seals a window, and a rewind may go back before it.
    committed = replace(
        state, txn=None, committed=txn.next, abort_streak=0, isolation=isolation,
        name_until=name_until, overrun=overrun,
        poison_offset=None if poison is not None and txn.next > poison else poison,
        poison_attempts=0 if poison is not None and txn.next > poison else state.poison_attempts)
    report = Committed(txn, event.seconds)
    if state.reposition_after_commit:  # what it holds is dropped: nothing left to drain
        return replace(committed, phase=Phase.POSITIONING, reposition_after_commit=False,
                       pauses=state.pauses - {Pause.BACKLOG}), [
            report, DropHeld(), LookupPosition(after_commit=True)]
    # A backlog pause stays until the drain brings what is held below the limits
    # (BacklogDrained): resumed here, a partition fetched a batch each commit while its
    # drain processed a few records, and held its whole lag.
    return replace(committed, phase=Phase.ACTIVE), [report, DrainHeld()]


def reached_end(state: PartitionState, event: ReachedEnd, policy: Policy) -> Step:
    """The partition read past its last record to ``event.end`` (commit markers,
    aborted records): the open transaction commits that end instead of its last
    record + 1; with none open and everything up to ``at`` committed, an offsets-only
    transaction opens, committed when due like any other (records that arrive first
    join it). Never past a record that was not processed: only from ``at``, the
    offset the open transaction (or the last commit) ends at."""
    txn = state.txn
    if state.phase is not Phase.ACTIVE or state.pauses or event.end <= event.at:
        return ignored(state)
    if txn is not None:
        if txn.next != event.at:
            return ignored(state)
        return replace(state, txn=replace(txn, next=event.end)), []
    if state.committed != event.at:
        return ignored(state)
    return replace(state, txn=Txn(event.at, event.end, 0, event.now)), []


def backlog_full(state: PartitionState, event: BacklogFull, policy: Policy) -> Step:
    """Committing, or active with records handed back at the poll-gap bound: no more
    fetching until what is held is processed (the commit's end or a drain)."""
    if state.phase not in (Phase.COMMITTING, Phase.ACTIVE):
        return ignored(state)
    return replace(state, pauses=state.pauses | {Pause.BACKLOG}), []


def backlog_drained(state: PartitionState, event: BacklogDrained, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE or Pause.BACKLOG not in state.pauses:
        return ignored(state)
    return replace(state, pauses=state.pauses - {Pause.BACKLOG}), []


def topic_unknown(state: PartitionState, event: TopicUnknown, policy: Policy) -> Step:
    if state.phase is not Phase.ACTIVE:
        return ignored(state)
    return replace(state, pauses=state.pauses | {Pause.LOOKUP}), [LookupTopic(event.topic)]


def topic_resolved(state: PartitionState, event: TopicResolved, policy: Policy) -> Step:
    if Pause.LOOKUP not in state.pauses:
        return ignored(state)
    state = replace(state, pauses=state.pauses - {Pause.LOOKUP})
    return state, [DrainHeld()] if state.phase is Phase.ACTIVE else []


def tick(state: PartitionState, event: Tick, policy: Policy) -> Step:
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
    return ignored(state)


def released(state: PartitionState, event: Released, policy: Policy) -> Step:
    """Revoke or stop: commit what is healthy, else abort; lost: abort, never commit.
    Either way the producer closes. The caller first waits (bounded) for work that
    was running, so only a job that overran its wait is abandoned here.

    At-least-once (``commits_deferred``) a healthy release commits with no window
    open as well: a window just sealed leaves ``txn`` None while its offsets wait to
    be delivered and committed. Told to commit nothing, the committer would drop
    them (the next owner redoing them) and not wait for its outputs in flight."""
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
