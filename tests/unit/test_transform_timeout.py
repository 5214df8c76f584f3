"""TXSTAGE_TRANSFORM_TIMEOUT_MS without a broker: the watch, the loop's marker, the
overrun record's bytes, the state machine's handling of an overrun, and the decision
to dead-letter a record without calling its transform (docs/state-machine.md, "Time
bounds the work"). The loop runs against the scripted consumer of test_positioning.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from service import Output, Record
from service.contract.processing import Produced, TransformTimeoutError
from service.errors import ConfigError
from service.examples.square import square
from service.settings import load_settings
from service.stage import machine as sm
from service.stage.loop import Loop
from service.stage.overruns import decode, encode, key_of, partition_of
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.transform_watch import Marker, TransformWatch, exhausted, timeout_ms
from tests.unit.fakes import POLICY, GroupConsumer, OrderedCommitter, batch, make_loop

OVERRUN = sm.Overrun(offset=2812, count=3, timeout_ms=60_000)  # POLICY: 3 attempts


def record(offset: int = 7) -> Record:
    return Record(topic="in", partition=0, offset=offset, key=None, value=b"1", headers=(),
                  timestamp=0)


# ------------------------------------------------------------------------- the watch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch(timeout_s: float = 1.0) -> tuple[TransformWatch, Marker, Clock, list[object]]:
    marker, clock, fired = Marker(), Clock(), []
    found = TransformWatch(marker, timeout_s, lambda r, s: fired.append((r, s)), clock)
    return found, marker, clock, fired


def looks(found: TransformWatch, clock: Clock, seconds: float) -> object:
    """Look every ``every_s`` for ``seconds``; the first overrun found, or None."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now += found.every_s
        if (overrun := found.look(clock.now)) is not None:
            return overrun
    return None


def test_the_watch_finds_a_call_running_past_the_time_out() -> None:
    found, marker, clock, _ = watch()
    hung = marker.record = record()
    assert looks(found, clock, 0.9) is None
    overrun = looks(found, clock, 0.2)
    assert overrun is not None and overrun[0] is hung and 1.0 <= overrun[1] < 1.1


def test_the_watch_leaves_slow_calls_that_finish_and_an_idle_loop_alone() -> None:
    found, marker, clock, _ = watch()
    for offset in range(20):  # 20 calls of 0.9 s each: 18 s of transform, none over 1 s
        marker.record = record(offset)
        assert looks(found, clock, 0.9) is None
        marker.record = None
        found.look(clock.now)
    assert looks(found, clock, 30) is None, "idle"


def test_time_the_process_did_not_run_is_not_counted() -> None:
    # SIGSTOP (a chaos pause, a frozen VM) for longer than the time-out in the middle
    # of a quick call: the record is not to blame.
    found, marker, clock, _ = watch()
    marker.record = record()
    assert looks(found, clock, 0.3) is None
    clock.now += 60
    assert found.look(clock.now) is None


def test_the_watch_thread_reports_an_overrun_once() -> None:
    marker, fired = Marker(), threading.Event()
    calls: list[tuple[Record, float]] = []

    def on_overrun(hung: Record, seconds: float) -> None:
        calls.append((hung, seconds))
        fired.set()

    found = TransformWatch(marker, 0.2, on_overrun)
    found.start()
    marker.record = record(1)
    time.sleep(0.1)
    marker.record = None  # a call that finished in time
    time.sleep(0.3)
    assert not calls
    marker.record = hung = record(2)
    assert fired.wait(2)
    time.sleep(0.3)
    found.stop()
    assert len(calls) == 1 and calls[0][0] is hung and calls[0][1] >= 0.2


# ------------------------------------------------------------------------ the marker


def marked_loop(**env: str) -> tuple[Loop, OrderedCommitter, Partition]:
    loop, _, partition = make_loop(GroupConsumer(), **env)
    committer = OrderedCommitter()
    loop.committer = committer  # type: ignore[assignment]
    loop.dispatch(partition, sm.Positioned(2810, time.monotonic()))
    loop.positions.next_batch()  # the records come after the seek
    return loop, committer, partition


@pytest.mark.parametrize("flowing", [True, False])
def test_the_marker_names_the_record_only_while_its_transform_runs(flowing: bool) -> None:
    loop, committer, partition = marked_loop()
    seen: list[object] = []

    def spying(rec: Record) -> Iterator[Output]:
        seen.append(loop.watch.record)
        if rec.offset == 2812:
            raise ValueError("poison")  # no DLQ: the partition backs off
        yield from square(rec)

    loop.transform = spying
    loop.runner.process(batch(2810, 2810), time.monotonic())  # the first after a seek: _one
    assert partition.flowing
    if not flowing:
        partition.flowing = False  # every record through _one
    loop.runner.process(batch(2811, 2812), time.monotonic())
    assert [getattr(r, "offset", None) for r in seen] == [2810, 2811, 2812]
    assert loop.watch.record is None, "cleared after a call that raised too"
    assert committer.written == [2810, 2811]


# ------------------------------------------------------------------------- the bytes


def test_an_overrun_record_round_trips_and_a_stranger_is_ignored() -> None:
    assert decode(encode(OVERRUN)) == OVERRUN
    assert partition_of(key_of("orders.v2", 11)) == ("orders.v2", 11)
    assert encode(OVERRUN) == b'{"offset": 2812, "overruns": 3, "timeout_ms": 60000}'
    for stranger in (None, b"", b"not json", b"[1]", b'{"offset": 1}', b'{"offset": "x"}'):
        assert decode(stranger) is None
    assert partition_of(b"no-partition") is None and partition_of(None) is None


# --------------------------------------------------------------- the state machine


def test_positioned_keeps_an_overrun_ahead_and_a_commit_past_it_clears_it() -> None:
    state = sm.PartitionState(sm.Phase.POSITIONING)
    ahead, _ = sm.transition(state, sm.Positioned(2800, 0.0, OVERRUN), POLICY)
    assert ahead.overrun == OVERRUN and not ahead.flowing
    at, _ = sm.transition(state, sm.Positioned(2812, 0.0, OVERRUN), POLICY)
    assert at.overrun == OVERRUN, "the record at the committed offset is still to do"
    stale, _ = sm.transition(state, sm.Positioned(2813, 0.0, OVERRUN), POLICY)
    assert stale.overrun is None and stale.flowing
    txn = sm.Txn(first=2800, next=2812, records=12, opened_at=0.0)
    before = sm.PartitionState(sm.Phase.COMMITTING, txn=txn, overrun=OVERRUN)
    assert sm.transition(before, sm.CommitDone(0.1, 0.0), POLICY)[0].overrun == OVERRUN
    past = sm.PartitionState(sm.Phase.COMMITTING, txn=sm.Txn(2800, 2813, 13, 0.0),
                             overrun=OVERRUN)
    done, _ = sm.transition(past, sm.CommitDone(0.1, 0.0), POLICY)
    assert done.overrun is None and done.flowing


# ------------------------------------------------------------------------ the decision


def test_a_record_is_dead_lettered_uncalled_once_it_overran_max_attempts_times() -> None:
    assert exhausted(OVERRUN, 2811, max_attempts=3) is None, "another record"
    assert exhausted(OVERRUN, 2812, max_attempts=4) is None, "attempts left: call it again"
    cause = exhausted(OVERRUN, 2812, max_attempts=3)
    assert isinstance(cause, TransformTimeoutError)
    assert str(cause) == ("the transform did not return within 60 s "
                          "(TXSTAGE_TRANSFORM_TIMEOUT_MS) on 3 attempts; not called again")


@dataclass
class LetterCommitter(OrderedCommitter):
    outputs: dict[int, list[Produced]] = field(default_factory=dict)

    def write(self, key: TopicPartitionKey, offset: int, outputs: list[Produced]) -> None:
        super().write(key, offset, outputs)
        self.outputs[offset] = outputs


def overrun_loop(count: int, **env: str) -> tuple[Loop, LetterCommitter, list[int]]:
    loop, _, partition = make_loop(GroupConsumer(), **env)
    committer = LetterCommitter()
    loop.committer = committer  # type: ignore[assignment]
    called: list[int] = []

    def counting(rec: Record) -> Iterator[Output]:
        called.append(rec.offset)
        yield from square(rec)

    loop.transform = counting
    loop.dispatch(partition, sm.Positioned(2810, time.monotonic(),
                                           sm.Overrun(2812, count, 5000)))
    loop.positions.next_batch()
    return loop, committer, called


def test_the_loop_dead_letters_an_exhausted_record_without_calling_the_transform() -> None:
    loop, committer, called = overrun_loop(3, TXSTAGE_DLQ_TOPIC="dlq")
    loop.runner.process(batch(2810, 2815), time.monotonic())
    assert called == [2810, 2811, 2813, 2814, 2815], "2812 is not called"
    assert committer.written == list(range(2810, 2816))
    [letter] = committer.outputs[2812]
    assert letter.topic == "dlq"
    assert dict(letter.headers)["txstage.error.class"] == b"TransformTimeoutError"


def test_the_loop_calls_the_transform_again_while_attempts_are_left() -> None:
    loop, committer, called = overrun_loop(2, TXSTAGE_DLQ_TOPIC="dlq")
    loop.runner.process(batch(2810, 2813), time.monotonic())
    assert called == [2810, 2811, 2812, 2813]
    assert {out.topic for outs in committer.outputs.values() for out in outs} == {"out"}


def test_without_a_dlq_an_exhausted_record_is_a_poison_record() -> None:
    loop, committer, called = overrun_loop(3)
    [partition] = loop.partitions.values()
    events: list[sm.Event] = []
    dispatch = loop.dispatch

    def spying(target: Partition, event: sm.Event) -> None:
        events.append(event)
        dispatch(target, event)

    loop.dispatch = spying  # type: ignore[method-assign]
    loop.runner.process(batch(2810, 2813), time.monotonic())
    assert called == [2810, 2811] and committer.written == [2810, 2811]
    [poisoned] = [e for e in events if isinstance(e, sm.Poisoned)]
    assert poisoned.error.offset == 2812 and isinstance(poisoned.error.cause,
                                                        TransformTimeoutError)
    # Then as any poison record: the good prefix committed, retried after a backoff,
    # and after TXSTAGE_MAX_RECORD_ATTEMPTS the replica fails with it (exit 3).
    assert partition.state.poison_offset == 2812 and committer.calls[-1] == ("commit", 2812)
    last = sm.PartitionState(sm.Phase.ACTIVE, poison_offset=2812,
                             poison_attempts=POLICY.max_record_attempts - 1)
    _, actions = sm.transition(last, poisoned, POLICY)
    assert any(isinstance(a, sm.Fail) and a.error is poisoned.error for a in actions)


# --------------------------------------------------------------------- the settings


BASE = {"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:9", "TXSTAGE_GROUP_ID": "g",
        "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
        "TXSTAGE_TRANSFORM": "service.examples.square:square"}


def test_the_time_out_must_be_below_the_poll_interval() -> None:
    assert timeout_ms(load_settings(BASE)) == 60_000
    with pytest.raises(ConfigError) as refused:
        load_settings({**BASE, "TXSTAGE_TRANSFORM_TIMEOUT_MS": "300000"})
    assert refused.value.problems == (
        "TXSTAGE_TRANSFORM_TIMEOUT_MS=300000 must be below the consumer's "
        "max.poll.interval.ms (300000), or 0 (off)",)
    with pytest.raises(ConfigError):
        load_settings({**BASE, "TXSTAGE_TRANSFORM_TIMEOUT_MS": "5000",
                       "TXSTAGE_CONSUMER__MAX_POLL_INTERVAL_MS": "3000"})
    with pytest.raises(ConfigError, match="TXSTAGE_TRANSFORM_TIMEOUT_MS"):
        load_settings({**BASE, "TXSTAGE_TRANSFORM_TIMEOUT_MS": "-1"})
    # Left at its default under a short poll interval (the chaos campaign's 15 s): off.
    short = load_settings({**BASE, "TXSTAGE_CONSUMER__MAX_POLL_INTERVAL_MS": "15000"})
    assert timeout_ms(short) == 0
    assert timeout_ms(load_settings({**BASE, "TXSTAGE_TRANSFORM_TIMEOUT_MS": "0"})) == 0
