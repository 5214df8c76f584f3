"""TXSTAGE_TRANSFORM_TIMEOUT_MS: a transform call that never returns becomes, after
``TXSTAGE_MAX_RECORD_ATTEMPTS`` overruns, a dead letter (docs/state-machine.md, "Time
bounds the work").

The loop thread runs the transform and cannot interrupt it (a Python thread cannot be
stopped from outside), so the call is left running and the replica goes instead:

- the hot path marks the call: ``Marker.record`` is set before the transform runs and
  cleared after it (two attribute stores a record, nothing allocated);
- ``TransformWatch``, a thread, looks at the marker a few times a time-out; the same
  record still marked after the time-out is an overrun;
- then the overrun is recorded for the next owner (stage/overruns.py), logged
  (``transform.timed_out``), health is marked fatal, and the replica leaves the group
  from this thread, without touching the loop's state, and exits
  ``ExitCode.TRANSFORM_TIMED_OUT``: what it had open is aborted by the next owner's
  init_transactions;
- the next owner reads the overrun when it positions the partition; at that offset it
  calls the transform again (watched), or, once the record has overrun as many times
  as a record may be attempted, dead-letters it without calling it (``exhausted``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from service.contract.processing import TransformTimeoutError
from service.contract.records import Record
from service.kafka.config import consumer_config
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage.machine import Overrun
from service.stage.overruns import OverrunBook

log = structlog.get_logger(__name__)

# How often the watch looks, as a share of the time-out (and at most every 0.5 s):
# an overrun is noticed at most that much late.
_LOOKS_PER_TIMEOUT = 20
# A gap between two looks longer than this many intervals is time the process did not
# run (SIGSTOP, a frozen VM): not counted, or a paused replica would blame its record.
_MAX_GAP_LOOKS = 4


class Marker:
    """The record whose transform call is running, or None: set and cleared by the
    loop thread around each call, read by the watch."""

    __slots__ = ("record",)

    def __init__(self) -> None:
        self.record: Record | None = None


def timeout_ms(settings: Settings) -> int:
    """The time-out in force: the setting, or 0 (off) when the setting was left at its
    default and the consumer's max.poll.interval.ms is not above it (past that interval
    librdkafka gives the partitions away before the overrun could be recorded; a value
    set explicitly there is refused by the settings' checks)."""
    poll = str(consumer_config(settings).get("max.poll.interval.ms", "")).strip()
    if poll.isdigit() and settings.transform_timeout_ms >= int(poll):
        return 0
    return settings.transform_timeout_ms


def exhausted(overrun: Overrun, offset: int, max_attempts: int) -> TransformTimeoutError | None:
    """The cause to dead-letter the record at ``offset`` with, without calling the
    transform: its calls overran ``max_attempts`` times already. None: call it."""
    if offset != overrun.offset or overrun.count < max_attempts:
        return None
    return TransformTimeoutError(
        f"the transform did not return within {overrun.timeout_ms / 1000:g} s "
        f"(TXSTAGE_TRANSFORM_TIMEOUT_MS) on {overrun.count} attempts; not called again")


class TransformWatch:
    """A thread that notices a transform call running past ``timeout_s`` and calls
    ``on_overrun(record, seconds)`` once (which does not return: the replica exits)."""

    def __init__(self, marker: Marker, timeout_s: float,
                 on_overrun: Callable[[Record, float], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.marker = marker
        self.timeout_s = timeout_s
        self.every_s = min(timeout_s / _LOOKS_PER_TIMEOUT, 0.5)
        self._on_overrun = on_overrun
        self._clock = clock
        self._seen: Record | None = None
        self._running_s = 0.0  # how long the call marked ``_seen`` has run, as looked at
        self._looked = clock()
        self._stop = threading.Event()

    def look(self, now: float) -> tuple[Record, float] | None:
        """The record and its call's seconds, once the call has run past the time-out."""
        gap = min(now - self._looked, self.every_s * _MAX_GAP_LOOKS)
        self._looked = now
        record = self.marker.record
        if record is None or record is not self._seen:
            self._seen, self._running_s = record, 0.0  # idle, or a new call began
            return None
        self._running_s += gap
        return (record, self._running_s) if self._running_s >= self.timeout_s else None

    def start(self) -> None:
        threading.Thread(target=self._run, name="transform-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            found = self.look(self._clock())
            if found is not None:
                self._on_overrun(*found)
                return


def overran(record: Record, seconds: float, *, book: OverrunBook, timeout: int,
            metrics: Metrics, health: Health, leave_and_exit: Callable[[], None]) -> None:
    """On the watch's thread: record the overrun where the next owner reads it, say so,
    and leave (``leave_and_exit``: the group, then the process; it does not return)."""
    where = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
    overruns: int | None = None
    try:
        overruns = book.record(record.topic, record.partition, record.offset, timeout).count
    except Exception as exc:  # a PermissionError names what the principal lacks
        log.error("transform.overrun_not_recorded", **where, overruns_topic=book.topic,
                  error=str(exc), error_class=type(exc).__name__,
                  note="the next owner calls the transform on it again")
    log.error("transform.timed_out", **where, seconds=round(seconds, 1),
              timeout_s=timeout / 1000, overruns=overruns,
              note="the call is left running; the replica leaves its group and exits")
    metrics.transform_timeouts.inc()
    health.fatal(f"the transform call on {record.topic}/{record.partition}@{record.offset} "
                 f"ran {seconds:.0f} s, past TXSTAGE_TRANSFORM_TIMEOUT_MS={timeout}")
    leave_and_exit()
