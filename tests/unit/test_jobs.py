"""The job pools beside the loop."""

from __future__ import annotations

import threading
import time

from service.stage import state as sm
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


def _in(seconds: float) -> float:
    return time.monotonic() + seconds
