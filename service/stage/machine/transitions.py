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

from collections.abc import Callable, Mapping
from typing import Any

from service.stage.machine import faults, lifecycle
from service.stage.machine.actions import PausePartition, ResumePartition, StartInit, Step
from service.stage.machine.events import (
    AbortDone,
    AbortFailed,
    BacklogDrained,
    BacklogFull,
    CallStuck,
    CommitDone,
    CommitDue,
    CommitFailed,
    DeliveryFailed,
    Event,
    InitDone,
    InitFailed,
    Poisoned,
    Positioned,
    PositionFailed,
    ProduceFailed,
    ReachedEnd,
    Released,
    SpanAborted,
    Tick,
    TopicResolved,
    TopicUnknown,
    Wrote,
)
from service.stage.machine.phases import LEGAL, PartitionState, Phase, Policy

Handler = Callable[[PartitionState, Any, Policy], Step]


class IllegalTransition(AssertionError):
    """A handler changed the phase in a way ``LEGAL`` does not list: a bug."""


def assigned() -> Step:
    """A newly assigned partition: paused until its producer is ready and its
    position is read from Kafka."""
    return PartitionState(Phase.INITIALISING), [PausePartition(), StartInit()]


def transition(state: PartitionState, event: Event, policy: Policy) -> Step:
    """The one entry point: the new state and what the loop must do, in order.

    Pause and resume are derived: they follow whether the partition has any
    pause reason before and after."""
    handler = HANDLERS.get(type(event))
    if handler is None:
        raise TypeError(f"not an event: {event!r}")
    new, actions = handler(state, event, policy)
    if new.phase is not state.phase and new.phase is not Phase.RELEASED \
            and new.phase not in LEGAL[state.phase]:
        raise IllegalTransition(f"{state.phase.value} -> {new.phase.value} on {event!r}")
    if new.phase is Phase.RELEASED:
        return new, actions  # no longer assigned: nothing to pause or resume
    if new.paused and not state.paused:
        actions.insert(0, PausePartition())
    elif state.paused and not new.paused:
        actions.append(ResumePartition())
    return new, actions


# Which handler takes which event: every event type has exactly one.
HANDLERS: Mapping[type, Handler] = {
    Wrote: lifecycle.wrote,
    InitDone: lifecycle.init_done,
    Positioned: lifecycle.positioned,
    CommitDue: lifecycle.commit_due,
    CommitDone: lifecycle.commit_done,
    BacklogFull: lifecycle.backlog_full,
    BacklogDrained: lifecycle.backlog_drained,
    TopicUnknown: lifecycle.topic_unknown,
    TopicResolved: lifecycle.topic_resolved,
    Tick: lifecycle.tick,
    ReachedEnd: lifecycle.reached_end,
    Released: lifecycle.released,
    InitFailed: faults.init_failed,
    PositionFailed: faults.position_failed,
    CommitFailed: faults.commit_failed,
    ProduceFailed: faults.produce_failed,
    DeliveryFailed: faults.delivery_failed,
    AbortDone: faults.abort_done,
    AbortFailed: faults.abort_failed,
    Poisoned: faults.poisoned,
    CallStuck: faults.call_stuck,
    SpanAborted: faults.span_aborted,
}
