"""Test-only transforms for the backfill, loaded by Spark's Python workers by module path
(``tests.harness.backfill_faults:<name>``; the workers run from the repository root).

Workers are forked before a test could set environment variables, so the knobs are
constants here, not TEST_* variables.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from pyspark import TaskContext

from service import Output, Record
from service.examples.square import square

CRASH_AT = 250  # an input offset inside every slice of the fault tests


def crash_on_first_attempt(record: Record) -> Iterator[Output]:
    """Square; but the first attempt of every Spark task dies at offset CRASH_AT.

    The worker process exits at once, mid-transaction, like a lost executor: no abort, no
    close. Before that it waits a moment so the open transaction's outputs are really on
    the broker (uncommitted): the retry must fence that attempt and hide them.
    """
    _die_on_the_first_attempt_at(CRASH_AT, record)
    yield from square(record)


REFUSING_TOPIC = "txstage-test-compacted"  # compacted: the broker refuses keyless records


def keyless_to_compacted_at_42(record: Record) -> Iterator[Output]:
    """Square; every record at an offset ending in 42 also writes a keyless record to
    the compacted REFUSING_TOPIC, on every attempt: the broker always refuses it, and
    the stream and the backfill must both dead-letter that record (nothing else)."""
    yield from square(record)
    if record.offset % 100 == 42:
        yield Output(value=b"no key", key=None, topic=REFUSING_TOPIC)


def _die_on_the_first_attempt_at(offset: int, record: Record) -> None:
    """At ``offset``, on a task's first attempt: wait a second (the open transaction's
    outputs reach the broker), then exit the worker at once, as a lost executor does."""
    context = TaskContext.get()
    if record.offset == offset and context is not None and context.attemptNumber() == 0:
        time.sleep(1.0)
        os._exit(17)


DIES_AT = 150  # past the refusal at 42 (committed) and before the one at 142 is found


def keyless_at_42_dying_at_150(record: Record) -> Iterator[Output]:
    """keyless_to_compacted_at_42, taking 2 ms a record, whose first attempt of every
    Spark task dies at offset DIES_AT mid-transaction (after a second, so the open
    transaction's outputs are on the broker): the retry must resume after the first
    refusal's committed dead letter, then isolate the second refusal itself. Expected
    output: keyless_to_compacted_at_42's."""
    time.sleep(0.002)
    _die_on_the_first_attempt_at(DIES_AT, record)
    yield from keyless_to_compacted_at_42(record)


SLOW_DIES_AT = 450  # reached only after the broker restart of the test that uses it


def slow_dying_at_450(record: Record) -> Iterator[Output]:
    """Square, taking 5 ms a record; the first attempt of every Spark task dies at
    offset SLOW_DIES_AT mid-transaction, like crash_on_first_attempt."""
    time.sleep(0.005)
    _die_on_the_first_attempt_at(SLOW_DIES_AT, record)
    yield from square(record)
