"""Test-only transforms for the backfill, loaded by Spark's Python workers by module path
(``tests.integration.backfill_faults:<name>``; the workers run from the repository root).

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
    context = TaskContext.get()
    if record.offset == CRASH_AT and context is not None and context.attemptNumber() == 0:
        time.sleep(1.0)
        os._exit(17)
    yield from square(record)


REFUSING_TOPIC = "txstage-test-compacted"  # compacted: the broker refuses keyless records


def keyless_to_compacted_at_42(record: Record) -> Iterator[Output]:
    """Square; every record at an offset ending in 42 also writes a keyless record to
    the compacted REFUSING_TOPIC, on every attempt: the broker always refuses it, and
    the stream and the backfill must both dead-letter that record (nothing else)."""
    yield from square(record)
    if record.offset % 100 == 42:
        yield Output(value=b"no key", key=None, topic=REFUSING_TOPIC)
