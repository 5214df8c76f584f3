"""One worker process: it imports the transform once and runs chunks of records sent
by the main process, one at a time, in order. It never touches Kafka.

Before each record it writes (chunk, index, start time) into memory the main process
shares, so the main process knows which record a worker was running when the worker
died or overran ``TXSTAGE_TRANSFORM_TIMEOUT_MS``: that record is blamed, not the
chunk. Signals meant for the stage (SIGTERM, SIGINT from a terminal's process group)
are ignored; a worker ends when the main process closes its pipe or kills it."""

from __future__ import annotations

import signal
import time
from collections.abc import MutableSequence
from multiprocessing.connection import Connection

from service.contract.loading import load_transform
from service.contract.records import Output, Record
from service.stage.workers.wire import Failure, WireOutput, WireRecord, WireResult, failure_of

# (chunk id, records, {index: failure decided by the main process: not run})
Task = tuple[int, list[WireRecord], dict[int, Failure]]


def serve(conn: Connection, transform_ref: str, progress: MutableSequence[int]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        transform = load_transform(transform_ref)
    except Exception as exc:  # ConfigError: the main process exits 2 with it
        conn.send(("failed", str(exc)))
        return
    conn.send(("ready", None))
    clock = time.monotonic_ns
    while True:
        try:
            task: Task | None = conn.recv()
        except EOFError:
            return  # the main process is gone
        if task is None:
            return
        chunk, records, decided = task
        results: list[WireResult] = []
        for index, fields in enumerate(records):
            started = clock()
            progress[0], progress[1], progress[2] = chunk, index, started
            failure = decided.get(index)
            if failure is not None:
                results.append(([], failure, 0.0))
                continue
            outputs: list[WireOutput] = []
            try:
                for out in transform(Record(*fields)):
                    outputs.append(_wire(out))
            except Exception as exc:
                results.append((outputs, failure_of(exc), (clock() - started) / 1e9))
            else:
                results.append((outputs, None, (clock() - started) / 1e9))
        progress[0] = -1
        conn.send((chunk, results))


def _wire(out: object) -> WireOutput:
    """An output as a tuple; not an Output: the error ``processing.process`` raises."""
    if not isinstance(out, Output):
        raise TypeError(f"the transform yielded a {type(out).__name__}, not service.Output")
    return out.value, out.key, out.topic, out.headers
