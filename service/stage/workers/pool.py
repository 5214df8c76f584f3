"""The main process's side of the worker pool: spawn the workers, send them chunks of
one partition's records, give the results back per partition in input order, and
replace a worker that dies or overruns the transform time-out.

Order and exactly-once by construction: each partition keeps a FIFO of its chunks in
flight, and a chunk's results are handed back only when every chunk before it in
that FIFO has been handed back. Nothing a worker computes is produced until then, so
a worker that dies costs only a re-run of its chunks (the transform is pure): no
transaction is aborted for it. A slow chunk holds back its own partition only.

A record that kills its worker, or runs past the time-out, is blamed by the shared
progress the worker writes before each record; once blamed
``max_record_attempts`` times it is not run again: its result is a failure, which the
stage dead-letters like any transform exception (docs/state-machine.md)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import structlog
from confluent_kafka import Message

from service.errors import ConfigError
from service.stage.workers import worker
from service.stage.workers.wire import Failure, WireRecord, WireResult

log = structlog.get_logger(__name__)

Key = tuple[str, int]
# Chunks a worker is given at once. One: a chunk queued behind a slow record on one
# worker would wait for it while another worker stands idle (the head-of-line blocking
# a slow record must not cause beyond its own partition). The cost is one pipe round
# trip between two chunks of a worker.
_PER_WORKER = 1
_READY_S = 60.0  # a worker's import of the transform
_FAILURES = "service.errors"


@dataclass(eq=False, slots=True)
class Chunk:
    """Consecutive records of one partition, as the loop consumed them."""

    key: Key
    owner: object              # the loop's Partition object that sent it
    epoch: int                 # the partition's epoch then (a seek or abort bumps it)
    messages: list[Message]
    records: list[WireRecord]
    size: int                  # bytes, for the loop's held accounting
    results: list[WireResult] | None = None
    dropped: bool = False
    id: int = 0


@dataclass(eq=False, slots=True)
class _Worker:
    process: BaseProcess
    conn: Connection
    progress: Any              # shared (chunk id, record index, start ns); -1: idle
    sent: deque[Chunk] = field(default_factory=deque)
    busy_ns: int = 0
    busy_since: int = 0


class WorkerPool:
    def __init__(self, transform_ref: str, workers: int, *, timeout_s: float,
                 max_record_attempts: int) -> None:
        self._ref = transform_ref
        self._size = workers
        self._timeout_ns = int(timeout_s * 1e9) if timeout_s > 0 else 0
        self._timeout_s = timeout_s
        self._max_attempts = max_record_attempts
        self._context = multiprocessing.get_context("spawn")  # never fork librdkafka's threads
        self._workers: list[_Worker] = []
        self._pending: deque[Chunk] = deque()
        self._order: dict[Key, deque[Chunk]] = {}
        self._blamed: dict[tuple[Key, int], tuple[int, Failure]] = {}
        self._next_id = 0
        self.restarts = 0
        self.timeouts = 0
        self.in_flight = 0     # chunks submitted and not handed back

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Spawn every worker and wait for each to import the transform; a transform
        that fails to import there is a ConfigError (exit 2), as in the main process."""
        self._workers = [self._spawn() for _ in range(self._size)]
        for handle in self._workers:
            self._await_ready(handle)
        log.info("workers.started", workers=self._size, pids=[w.process.pid for w in self._workers])

    def _spawn(self) -> _Worker:
        ours, theirs = self._context.Pipe()
        progress = self._context.Array("q", 3, lock=False)
        progress[0] = -1
        process = self._context.Process(target=worker.serve, args=(theirs, self._ref, progress),
                                        name="txstage-worker", daemon=True)
        process.start()
        theirs.close()
        return _Worker(process, ours, progress)

    def _await_ready(self, handle: _Worker) -> None:
        if not handle.conn.poll(_READY_S):
            raise ConfigError(f"a transform worker did not start within {_READY_S:.0f} s")
        try:
            kind, detail = handle.conn.recv()
        except EOFError as exc:
            raise ConfigError(f"a transform worker died while starting "
                              f"(exit code {handle.process.exitcode})") from exc
        if kind == "failed":
            raise ConfigError(f"in a worker process: {detail}")

    def shutdown(self) -> None:
        for handle in self._workers:
            with contextlib.suppress(OSError):
                handle.conn.send(None)
        deadline = time.monotonic() + 1.0
        for handle in self._workers:
            handle.process.join(max(deadline - time.monotonic(), 0))
            if handle.process.is_alive():
                handle.process.kill()
                handle.process.join(1.0)
            handle.conn.close()
        self._workers = []

    @property
    def alive(self) -> int:
        return sum(1 for handle in self._workers if handle.process.is_alive())

    def busy_seconds(self) -> float:
        """Seconds the workers have spent on chunks so far (a counter's value)."""
        now = time.monotonic_ns()
        return sum(h.busy_ns + (now - h.busy_since if h.sent else 0)
                   for h in self._workers) / 1e9

    # ----------------------------------------------------------------- chunks

    def submit(self, key: Key, owner: object, epoch: int, messages: list[Message],
               records: list[WireRecord], size: int) -> Chunk:
        chunk = Chunk(key, owner, epoch, messages, records, size, id=self._next_id)
        self._next_id += 1
        self._order.setdefault(key, deque()).append(chunk)
        self._pending.append(chunk)
        self.in_flight += 1
        self._send()
        return chunk

    def discard(self, key: Key) -> list[Chunk]:
        """Forget a partition's chunks (revoked, sought back, aborted): none of their
        results is handed back. What is being run still finishes, unread."""
        chunks = list(self._order.pop(key, ()))
        for chunk in chunks:
            chunk.dropped = True
        if chunks:
            self._pending = deque(c for c in self._pending if not c.dropped)
            self.in_flight -= len(chunks)
        return chunks

    def completed(self) -> Iterator[Chunk]:
        """Each partition's chunks whose results are in, and every chunk before them."""
        for key in list(self._order):
            order = self._order[key]
            while order and order[0].results is not None:
                self.in_flight -= 1
                yield order.popleft()
            if not order:
                del self._order[key]

    def serve(self, timeout: float = 0.0) -> None:
        """Read the results that have come, replace dead or overrunning workers and
        send what is pending; waits up to ``timeout`` for something to come."""
        handles = self._workers
        if timeout > 0 and any(h.sent for h in handles):
            ready = wait([h.conn for h in handles if h.sent], timeout)
        else:
            ready = [h.conn for h in handles if h.sent and h.conn.poll()]
        for handle in handles:
            if handle.conn in ready:
                self._receive(handle)
        self._watch()
        self._send()

    def _receive(self, handle: _Worker) -> None:
        try:
            while handle.sent and handle.conn.poll():
                chunk_id, results = handle.conn.recv()
                chunk = handle.sent.popleft()
                assert chunk.id == chunk_id, (chunk.id, chunk_id)
                if not chunk.dropped:
                    chunk.results = results
                now = time.monotonic_ns()
                handle.busy_ns += now - handle.busy_since
                handle.busy_since = now
        except (EOFError, OSError):
            pass  # it died: _watch replaces it

    def _watch(self) -> None:
        now = time.monotonic_ns()
        for slot, handle in enumerate(self._workers):
            progress = handle.progress
            overrun = self._timeout_ns and progress[0] >= 0 and \
                now - progress[2] > self._timeout_ns
            if handle.process.is_alive() and not overrun:
                continue
            if overrun:
                self.timeouts += 1
                os.kill(handle.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            handle.process.join(5.0)
            self._replace(slot, handle, timed_out=bool(overrun))

    def _replace(self, slot: int, handle: _Worker, *, timed_out: bool) -> None:
        """The worker is dead: blame the record it was running, send its chunks again
        (first, in their order) to the worker that takes its place."""
        progress = handle.progress
        running = next((c for c in handle.sent if c.id == progress[0]), None)
        cause = None
        if running is not None and 0 <= progress[1] < len(running.records):
            cause = self._blame(running, progress[1], handle.process.exitcode, timed_out)
        log.error("worker.replaced", pid=handle.process.pid, exit_code=handle.process.exitcode,
                  timed_out=timed_out, blamed=cause)
        resend = [c for c in handle.sent if not c.dropped]
        self._pending.extendleft(reversed(resend))
        handle.conn.close()
        self.restarts += 1
        replacement = self._spawn()
        self._await_ready(replacement)
        self._workers[slot] = replacement

    def _blame(self, chunk: Chunk, index: int, exit_code: int | None,
               timed_out: bool) -> str:
        offset = chunk.records[index][2]
        count, _ = self._blamed.get((chunk.key, offset), (0, ("", "", "")))
        count += 1
        if timed_out:
            failure = (_FAILURES, "TransformTimeoutError",
                       f"the transform ran past TXSTAGE_TRANSFORM_TIMEOUT_MS="
                       f"{self._timeout_s * 1000:.0f} on {count} attempt(s); its worker "
                       f"process was killed")
        else:
            failure = (_FAILURES, "TransformCrashedError",
                       f"the transform ended its worker process ({_exit(exit_code)}) on "
                       f"{count} attempt(s)")
        self._blamed[(chunk.key, offset)] = (count, failure)
        return f"{chunk.key[0]}/{chunk.key[1]}@{offset}: {failure[2]}"

    def _send(self) -> None:
        """Each pending chunk, in order, to a worker that has none."""
        pending = self._pending
        while pending:
            handle = min(self._workers, key=_load, default=None)
            if handle is None or len(handle.sent) >= _PER_WORKER:
                return
            chunk = pending.popleft()
            if chunk.dropped:
                continue
            try:
                handle.conn.send((chunk.id, chunk.records, self._decided(chunk)))
            except OSError:
                pending.appendleft(chunk)
                return  # it died: _watch replaces it
            if not handle.sent:
                handle.busy_since = time.monotonic_ns()
            handle.sent.append(chunk)

    def _decided(self, chunk: Chunk) -> dict[int, Failure]:
        """The records of the chunk blamed too often to be run again: their failures."""
        if not self._blamed:
            return {}
        decided = {}
        for index, record in enumerate(chunk.records):
            blamed = self._blamed.get((chunk.key, record[2]))
            if blamed is not None and blamed[0] >= self._max_attempts:
                decided[index] = blamed[1]
        return decided


def _load(handle: _Worker) -> int:
    return len(handle.sent)


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
