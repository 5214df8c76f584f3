"""Work that waits on Kafka, run beside the loop: inits, commits, aborts, position
and topic lookups, closes. A finished job's event comes back through a queue the
loop drains between batches; the rebalance listener may instead wait for one."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

import structlog

from service.stage.guarantees.guarantee import ReleaseReport
from service.stage.machine import Event
from service.stage.partition import Completion, Partition

log = structlog.get_logger(__name__)
T = TypeVar("T")


class Jobs:
    """Two pools. Commits, aborts and closes share ``workers`` threads: more would let
    every partition commit at once on a small machine, and each commit slows down.
    An assignment's inits and position reads get ``startup_workers`` of their own:
    they wait on the broker, not the CPU, and no partition fetches before its own
    are done, so waves of them are time every new partition stands still."""

    def __init__(self, workers: int = 16, startup_workers: int = 64) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="txstage-job")
        self._startup = ThreadPoolExecutor(max_workers=startup_workers,
                                           thread_name_prefix="txstage-start")
        self._done: queue.SimpleQueue[tuple[Partition, object, Completion]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = 0
        self._stuck = 0  # written-off jobs still holding their threads
        self._finished = threading.Event()  # set after each completion is queued

    def start(self, partition: Partition, job: Callable[[], Event | ReleaseReport | None], *,
              startup: bool = False) -> None:
        """Run ``job`` for ``partition``; its completion is the partition's next event.
        ``startup``: an init or a position read, on the startup pool."""
        token = object()

        def run() -> Completion:
            try:
                completion: Completion = (job(), None)
            except BaseException as exc:  # raised on the loop thread when collected
                completion = (None, exc)
            self._done.put((partition, token, completion))
            self._finished.set()
            return completion

        executor = self._startup if startup else self._executor
        partition.job = (token, executor.submit(self._counted(run)))

    def abandon(self, partition: Partition, then: Callable[[], object]) -> None:
        """The partition is gone; run ``then`` (close its producer) once its job, if
        any, has ended, beside the loop.

        A done-callback of the job's future: the future runs it exactly once, whether
        it ends before or after this call (or is cancelled by a shutdown). A hook the
        loop set here for the job thread to read would let each side leave the close
        to the other: the job reads it just before the loop sets it, the loop then
        finds the future not done yet, and the producer is never closed."""
        job = partition.job
        if job is None or job[1].done():
            self.spawn(then)  # not on the loop thread: a close may wait
            return
        # Should it end between these two lines, the future runs ``then`` at once,
        # here on the loop thread: rare, and still correct.
        job[1].add_done_callback(lambda _: self._counted(_logged(then))())

    def write_off(self, partition: Partition, then: Callable[[], object]) -> int:
        """The partition's job is stuck in a call that outlived its own deadline:
        forget it, and run ``then`` (close its producer) once it ends, if it ever does.
        A job still queued is cancelled (it would run on a producer given up) and
        ``then`` runs now. How many written-off jobs are still stuck."""
        job, partition.job = partition.job, None
        if job is None or job[1].cancel() or job[1].done():
            self.spawn(then)
            return self._stuck
        with self._lock:
            self._stuck += 1

        def ended(_: object) -> None:
            with self._lock:
                self._stuck -= 1
            self.spawn(then)
        job[1].add_done_callback(ended)
        return self._stuck

    def spawn(self, job: Callable[[], object]) -> Future[object]:
        """Fire and forget (closing a producer); failures are logged."""
        return self._executor.submit(self._counted(_logged(job)))

    def submit(self, job: Callable[[], object]) -> Future[object]:
        return self._executor.submit(self._counted(job))

    def wait_finished(self, timeout: float) -> None:
        """Until a job finishes (one may have since the last call), at most
        ``timeout``; its completion is then read with ``completions``."""
        self._finished.wait(timeout)
        self._finished.clear()

    def completions(self) -> Iterator[tuple[Partition, Completion]]:
        """Finished jobs whose partition still waits for them, oldest first."""
        while True:
            try:
                partition, token, completion = self._done.get_nowait()
            except queue.Empty:
                return
            if partition.job is not None and partition.job[0] is token:
                partition.job = None
                yield partition, completion

    def wait(self, partition: Partition, deadline: float) -> Completion | None:
        """Wait until ``deadline`` for the partition's job; its completion, or None
        if it is still running (or there was none)."""
        if partition.job is None:
            return None
        token, future = partition.job
        try:
            completion = future.result(timeout=max(deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            return None
        if partition.job is not None and partition.job[0] is token:
            partition.job = None
            return completion
        return None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._startup.shutdown(wait=False, cancel_futures=True)

    @property
    def busy(self) -> bool:
        """A job still runs (stuck on Kafka past the shutdown budget, say)."""
        return self._running > 0

    @property
    def running(self) -> int:
        return self._running

    def _counted(self, job: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            with self._lock:
                self._running += 1
            try:
                return job()
            finally:
                with self._lock:
                    self._running -= 1
        return run


def _logged(job: Callable[[], object]) -> Callable[[], object]:
    """``job``, its failure logged instead of raised (nobody waits for it)."""
    def run() -> object:
        try:
            return job()
        except Exception as exc:
            log.warning("job.failed", error=str(exc), error_class=type(exc).__name__)
            return None
    return run
