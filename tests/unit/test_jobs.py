"""The job pools beside the loop."""

from __future__ import annotations

import threading
import time

from service.stage import machine as sm
from service.stage.jobs import Jobs
from service.stage.partition import Partition


def test_inits_do_not_wait_behind_commits() -> None:
    # With one pool, an assignment's inits queued behind commits (and each other):
    # 64 partitions were ready in four waves of 16.
    jobs = Jobs(workers=1, startup_workers=2)
    release = threading.Event()
    committing, first, second = Partition("in", 0), Partition("in", 1), Partition("in", 2)
    jobs.start(committing, lambda: (release.wait(10), None)[1])
    both = threading.Barrier(2, timeout=5)
    for partition in (first, second):  # both must run at once to pass the barrier
        jobs.start(partition, lambda: (both.wait(), sm.InitDone(0.0))[1], startup=True)
    try:
        assert isinstance((jobs.wait(first, _in(5)) or (None, None))[0], sm.InitDone)
        assert isinstance((jobs.wait(second, _in(5)) or (None, None))[0], sm.InitDone)
        assert committing.job is not None and not committing.job[1].done()
    finally:
        release.set()
        jobs.shutdown()


class EndHeld:
    """Jobs' counter lock, its job thread held as the job ends (job() returned, its
    completion queued) until the test lets it go: the moment the loop may abandon the
    partition, seeing the job's future not done yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entered = 0
        self.ending, self.go = threading.Event(), threading.Event()

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            self._entered += 1
            if self._entered == 2:  # the first counted the job in; this counts it out
                self.ending.set()
                assert self.go.wait(5)
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_job_abandoned_as_it_ends_still_runs_what_the_release_left_it() -> None:
    # The job thread read the abandon hook (None) just before the loop set it; the
    # loop then found the future not done and left the close to the job: the detached
    # producer was never closed.
    jobs = Jobs()
    held = EndHeld()
    jobs._lock = held  # type: ignore[assignment]
    partition, closed = Partition("in", 0), threading.Event()
    try:
        jobs.start(partition, lambda: None)
        assert held.ending.wait(5)
        jobs.abandon(partition, closed.set)
        held.go.set()
        assert closed.wait(5), "the abandoned job's producer was never closed"
    finally:
        held.go.set()
        jobs.shutdown()


def test_an_abandoned_job_already_over_or_never_started_runs_it_too() -> None:
    jobs = Jobs()
    over, idle = Partition("in", 0), Partition("in", 1)
    try:
        jobs.start(over, lambda: None)
        assert over.job is not None
        over.job[1].result(5)
        closed = [threading.Event(), threading.Event()]
        jobs.abandon(over, closed[0].set)
        jobs.abandon(idle, closed[1].set)
        assert all(event.wait(5) for event in closed)
    finally:
        jobs.shutdown()


def _in(seconds: float) -> float:
    return time.monotonic() + seconds


def test_a_queued_job_written_off_as_stuck_is_cancelled_and_its_close_runs() -> None:
    # The pool's only thread is held; a commit queued behind it is written off
    # (CallStuck) before it starts: it must never run on the producer given up.
    jobs = Jobs(workers=1)
    hold, ran, closed = threading.Event(), threading.Event(), threading.Event()
    busy, queued = Partition("in", 0), Partition("in", 1)
    jobs.start(busy, lambda: (hold.wait(10), None)[1])
    jobs.start(queued, lambda: (ran.set(), None)[1])
    try:
        assert jobs.write_off(queued, closed.set) == 0, "a queued job is not stuck"
        hold.set()
        assert closed.wait(5), "the given-up producer was not closed"
        assert not ran.is_set(), "the written-off job ran"
    finally:
        hold.set()
        jobs.shutdown()


def test_a_stuck_job_is_counted_until_it_returns_then_its_producer_closes() -> None:
    jobs = Jobs(workers=2)
    hold, closed = threading.Event(), threading.Event()
    stuck = Partition("in", 0)
    jobs.start(stuck, lambda: (hold.wait(10), None)[1])
    time.sleep(0.05)  # running
    try:
        assert jobs.write_off(stuck, closed.set) == 1
        assert stuck.job is None and not closed.is_set()
        hold.set()
        assert closed.wait(5)
        assert jobs.write_off(Partition("in", 1), lambda: None) == 0
    finally:
        hold.set()
        jobs.shutdown()
