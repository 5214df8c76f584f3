"""Transforms used only by the integration tests, loaded by replicas as
``tests.integration.transforms:<name>`` (the replica runs from the repo root)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from service import Output, Record
from service.examples.square import square

_failed_once: set[tuple[str, int, int]] = set()


def square_with_broker_rejects(record: Record) -> Iterator[Output]:
    """Like square, but on its first attempt at every 50th offset it also writes a
    keyless record to a compacted topic. The broker refuses it (INVALID_RECORD), a
    real abortable error: the stage must abort, rewind and redo the whole
    transaction. The retry succeeds, so the expected output is plain square's."""
    yield from square(record)
    coordinates = (record.topic, record.partition, record.offset)
    if record.offset % 50 == 0 and coordinates not in _failed_once:
        _failed_once.add(coordinates)
        yield Output(value=b"no key", key=None, topic=os.environ["TEST_COMPACTED_TOPIC"])


def slow_square(record: Record) -> Iterator[Output]:
    """Square, taking ``TEST_DELAY_MS`` per record: keeps transactions open long enough
    for a kill or a pause to land in the middle of one."""
    time.sleep(int(os.environ.get("TEST_DELAY_MS", "2")) / 1000)
    yield from square(record)


def stuck_after(record: Record) -> Iterator[Output]:
    """Square until offset ``TEST_STUCK_AT``, then block forever (a wedged transform)."""
    if record.offset >= int(os.environ.get("TEST_STUCK_AT", "10")):
        time.sleep(3600)
    yield from square(record)


def stall_once(record: Record) -> Iterator[Output]:
    """Square; at offset ``TEST_STALL_AT`` of each partition, sleep ``TEST_STALL_S`` once
    (first attempt only): a transform stuck past a time-out, then recovered."""
    coordinates = (record.topic, record.partition, record.offset)
    if record.offset == int(os.environ.get("TEST_STALL_AT", "5")) and \
            record.partition == 0 and coordinates not in _failed_once:
        _failed_once.add(coordinates)
        time.sleep(float(os.environ.get("TEST_STALL_S", "5")))
    yield from square(record)


def big_every_tenth(record: Record) -> Iterator[Output]:
    """Square, but every tenth record's output is 50 KB: more than the output topic
    takes. It must be dead-lettered, not produced (an abort loop) nor dropped."""
    if record.offset % 10 == 3:
        yield Output(value=b"x" * 50_000, key=record.key)
    else:
        yield from square(record)


def square_unless_big(record: Record) -> Iterator[Output]:
    """What the stage must write for big_every_tenth: the big ones become dead letters."""
    if record.offset % 10 == 3:
        raise ValueError("too large")
    yield from square(record)


def square_with_refused_outputs(record: Record) -> Iterator[Output]:
    """Square, but every record at an offset ending in 42 also writes a keyless record
    to a compacted topic, on every attempt: the broker always refuses it. Retrying
    cannot help; the stage must find that record and dead-letter it."""
    yield from square(record)
    if record.offset % 100 == 42:
        yield Output(value=b"no key", key=None, topic=os.environ["TEST_COMPACTED_TOPIC"])


def square_unless_refused(record: Record) -> Iterator[Output]:
    """What the stage must write for square_with_refused_outputs."""
    if record.offset % 100 == 42:
        raise ValueError("refused by the broker")
    yield from square(record)
