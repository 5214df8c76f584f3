"""Work that waits on Kafka, run beside the loop: inits, commits, aborts, position
and topic lookups, closes. A finished job's event comes back through a queue the
loop drains between batches; the rebalance listener may instead wait for one."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import structlog

from service.stage.partition import Completion, Partition
from service.stage.state import Event

log = structlog.get_logger(__name__)


class Jobs:
    def __init__(self, on_abandoned: Callable[[Partition], None], workers: int = 16) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="txstage-job")
        self._done: queue.SimpleQueue[tuple[Partition, object, Completion]] = queue.SimpleQueue()
        self._on_abandoned = on_abandoned

    def start(self, partition: Partition, job: Callable[[], Event | None]) -> None:
        """Run ``job`` for ``partition``; its completion is the partition's next event."""
        token = object()

        def run() -> Completion:
            try:
                completion: Completion = (job(), None)
            except BaseException as exc:  # raised on the loop thread when collected
                completion = (None, exc)
            self._done.put((partition, token, completion))
            if partition.abandoned:
                self._on_abandoned(partition)
            return completion

        partition.job = (token, self._executor.submit(run))

    def spawn(self, job: Callable[[], object]) -> Future[object]:
        """Fire and forget (closing a producer); failures are logged."""
        def run() -> object:
            try:
                return job()
            except Exception as exc:
                log.warning("job.failed", error=str(exc), error_class=type(exc).__name__)
                return None
        return self._executor.submit(run)

    def submit(self, job: Callable[[], object]) -> Future[object]:
        return self._executor.submit(job)

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
