"""Transforms used only by the integration tests, loaded by replicas as
``tests.harness.transforms:<name>`` (the replica runs from the repo root)."""

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


_runs: dict[tuple[str, int, int], int] = {}


def square_and_count_runs(record: Record) -> Iterator[Output]:
    """Square, plus a record to ``TEST_SIDE_TOPIC`` whose value is how many times
    this process has run the transform on this input: "1" everywhere unless the
    stage ran it again (an abort, a rebalance, or a second run it had no need of)."""
    coordinates = (record.topic, record.partition, record.offset)
    runs = _runs[coordinates] = _runs.get(coordinates, 0) + 1
    yield from square(record)
    yield Output(value=str(runs).encode(), key=record.key, topic=os.environ["TEST_SIDE_TOPIC"])


def slow_square(record: Record) -> Iterator[Output]:
    """Square, taking ``TEST_DELAY_MS`` per record: keeps transactions open long enough
    for a kill or a pause to land in the middle of one."""
    time.sleep(int(os.environ.get("TEST_DELAY_MS", "2")) / 1000)
    yield from square(record)


def slow_until(record: Record) -> Iterator[Output]:
    """Square, taking ``TEST_DELAY_MS`` per record until the epoch second
    ``TEST_SLOW_UNTIL`` (set when the replica starts), then at full speed: a lag worked
    through slowly for a while, without a test that waits for all of it that slowly."""
    if time.time() < float(os.environ.get("TEST_SLOW_UNTIL", "0")):
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


def _delay() -> None:
    time.sleep(int(os.environ.get("TEST_DELAY_MS", "3")) / 1000)


def refuse_then_stall(record: Record) -> Iterator[Output]:
    """Square. On partition 0 only, first attempt only: at offset ``TEST_REFUSE_AT`` also
    write a keyless record to the compacted ``TEST_COMPACTED_TOPIC`` (the broker refuses
    it: the transaction becomes abortable), then at offset ``TEST_STALL_AT`` sleep
    ``TEST_STALL_S``, longer than the transaction time-out, so the coordinator has
    aborted the transaction (and bumped the epoch) before the stage gets to abort it.
    Retries succeed: the expected output is plain square's."""
    coordinates = (record.topic, record.partition, record.offset)
    first_attempt = record.partition == 0 and coordinates not in _failed_once
    if first_attempt and record.offset == int(os.environ.get("TEST_STALL_AT", "5")):
        _failed_once.add(coordinates)
        time.sleep(float(os.environ.get("TEST_STALL_S", "6")))
    yield from square(record)
    if first_attempt and record.offset == int(os.environ.get("TEST_REFUSE_AT", "4")):
        _failed_once.add(coordinates)
        yield Output(value=b"no key", key=None, topic=os.environ["TEST_COMPACTED_TOPIC"])


def slow_square_with_refused_outputs(record: Record) -> Iterator[Output]:
    """square_with_refused_outputs taking ``TEST_DELAY_MS`` (default 3) per record: the
    refusal reaches the stage while the transaction is still being filled, not only
    when it commits. Expected output: square_unless_refused."""
    _delay()
    yield from square_with_refused_outputs(record)


def refused_on_some_partitions(record: Record) -> Iterator[Output]:
    """Square taking ``TEST_DELAY_MS`` per record, except on input partitions
    ``TEST_REFUSING_PARTITIONS`` (default "1,5"): there a record at an offset ending in 42
    writes only a keyless record to the compacted ``TEST_COMPACTED_TOPIC``, refused on
    every attempt. Only the refused output, so an at-least-once stage cannot have made
    part of the record visible before dead-lettering it."""
    _delay()
    if _refuses(record):
        yield Output(value=b"no key", key=None, topic=os.environ["TEST_COMPACTED_TOPIC"])
    else:
        yield from square(record)


def square_unless_refused_on_some_partitions(record: Record) -> Iterator[Output]:
    """What the stage must write for refused_on_some_partitions."""
    if _refuses(record):
        raise ValueError("refused by the broker")
    yield from square(record)


def _refuses(record: Record) -> bool:
    partitions = os.environ.get("TEST_REFUSING_PARTITIONS", "1,5").split(",")
    return record.offset % 100 == 42 and str(record.partition) in partitions


def tenth_to_a_missing_topic(record: Record) -> Iterator[Output]:
    """Square, but every tenth record (offset ending in 7) routes its output to
    ``TEST_MISSING_TOPIC``, a topic that does not exist. Expected output:
    square_unless_tenth (those records dead-lettered). Takes ``TEST_DELAY_MS`` (default 0)
    per record."""
    time.sleep(int(os.environ.get("TEST_DELAY_MS", "0")) / 1000)
    if record.offset % 10 == 7:
        yield Output(value=record.value, key=record.key, topic=os.environ["TEST_MISSING_TOPIC"])
    else:
        yield from square(record)


def square_unless_tenth(record: Record) -> Iterator[Output]:
    """What the stage must write for tenth_to_a_missing_topic."""
    if record.offset % 10 == 7:
        raise LookupError("no such topic")
    yield from square(record)


def slow_refused_before_commit(record: Record) -> Iterator[Output]:
    """Square taking ``TEST_DELAY_MS`` per record; every record at an offset ending in 49
    or 99 also writes a keyless record to the compacted ``TEST_COMPACTED_TOPIC``, refused
    on every attempt. With 50-record batches and transactions, it is the last record
    before a commit. Expected output: square_unless_refused_before_commit."""
    _delay()
    yield from square(record)
    if record.offset % 50 == 49:
        yield Output(value=b"no key", key=None, topic=os.environ["TEST_COMPACTED_TOPIC"])


def square_unless_refused_before_commit(record: Record) -> Iterator[Output]:
    """What the stage must write for slow_refused_before_commit."""
    if record.offset % 50 == 49:
        raise ValueError("refused by the broker")
    yield from square(record)


def chaos(record: Record) -> Iterator[Output]:
    """The chaos campaign's transform (tests/chaos): square, plus faults decided by
    the record itself (so ``verify`` can predict the outputs) or switched on from
    outside:

    - every 997th offset sleeps 20 ms (slow records);
    - a value that is a multiple of 1009 raises: dead-lettered;
    - the value ``hang`` sleeps an hour: a call that never returns (``chaos_expected``);
    - while the file ``TEST_STALL_FILE`` exists, the first record to see it removes it
      and sleeps the seconds written in it (a stall past a time-out, injected by the
      campaign at a moment of its choosing);
    - while the file ``TEST_SLOW_FILE`` says so (``<ms> <until, epoch seconds>``), every
      record takes that long (a slow phase; the file is read every 0.25 s)."""
    if record.offset % 997 == 0:
        time.sleep(0.02)
    slow_ms = _slow_phase_ms()
    if slow_ms:
        time.sleep(slow_ms / 1000)
    stall_file = os.environ.get("TEST_STALL_FILE")
    if stall_file and os.path.exists(stall_file):
        try:
            with open(stall_file) as f:
                seconds = float(f.read() or "0")
            os.remove(stall_file)
        except (OSError, ValueError):
            seconds = 0.0  # another replica took it first
        time.sleep(seconds)
    if record.value == HANG:
        time.sleep(3600)  # a call that never returns (the campaign's transform_hang)
    if record.value is not None and record.value.isdigit() and int(record.value) % 1009 == 0:
        raise ValueError(f"chaos: {int(record.value)} is a multiple of 1009")
    yield from square(record)


HANG = b"hang"


def chaos_expected(record: Record) -> Iterator[Output]:
    """What the stage must write for ``chaos``: the same, but a record that hangs is
    dead-lettered (after its overruns), which the verifier reads as a failure here."""
    if record.value == HANG:
        raise TimeoutError("the transform never returned")
    yield from chaos(record)


_slow_phase: list[float] = [0.0, 0.0, 0.0]  # checked at (monotonic), ms, until (epoch)


def _slow_phase_ms() -> float:
    checked_at, ms, until = _slow_phase
    now = time.monotonic()
    if now - checked_at >= 0.25:
        ms, until = 0.0, 0.0
        slow_file = os.environ.get("TEST_SLOW_FILE")
        if slow_file:
            try:
                with open(slow_file) as f:
                    ms, until = (float(part) for part in f.read().split())
            except (OSError, ValueError):
                pass
        _slow_phase[:] = [now, ms, until]
    return ms if time.time() < until else 0.0


def square_broken_on_sevens(record: Record) -> Iterator[Output]:
    """Square with a bug: it fails on multiples of 7 (they go to the DLQ). With
    ``TEST_TRANSFORM_FIXED`` set the bug is fixed but a rarer one stays: multiples of 49
    still fail. ``TEST_DELAY_MS`` per record (default 0)."""
    time.sleep(int(os.environ.get("TEST_DELAY_MS", "0")) / 1000)
    n = int(record.value or b"")
    broken = 49 if os.environ.get("TEST_TRANSFORM_FIXED") else 7
    if n % broken == 0:
        raise ValueError(f"{n} is a multiple of {broken}")
    yield from square(record)


def square_and_copy_to_side(record: Record) -> Iterator[Output]:
    """Square, and the input's value again to ``TEST_SIDE_TOPIC`` (default
    ``<input topic>-side``, which a Spark worker knows without the environment): a
    fan-out to a second topic."""
    yield from square(record)
    side = os.environ.get("TEST_SIDE_TOPIC") or f"{record.topic}-side"
    yield Output(value=record.value, key=record.key, topic=side)


def square_failing_on_49s(record: Record) -> Iterator[Output]:
    """square_broken_on_sevens once fixed (TEST_TRANSFORM_FIXED), without the variable:
    a Spark worker started before a test set it would not see it."""
    n = int(record.value or b"")
    if n % 49 == 0:
        raise ValueError(f"{n} is a multiple of 49")
    yield from square(record)


REJECTED = b"reject:"


def identity_rejecting_marked(record: Record) -> Iterator[Output]:
    """Each record as it came (key and value), but one whose value starts with
    ``REJECTED`` fails (it is dead-lettered) until ``TEST_TRANSFORM_FIXED`` is set."""
    if (record.value or b"").startswith(REJECTED) and not os.environ.get("TEST_TRANSFORM_FIXED"):
        raise ValueError("a marked record")
    yield Output(value=record.value, key=record.key)


def square_and_rare_side(record: Record) -> Iterator[Output]:
    """Square; the record at offset 150 of each partition (past the driver's sample of a
    slice, its first 100 records) also writes its value to ``<input topic>-rare``."""
    yield from square(record)
    if record.offset == 150:
        yield Output(value=record.value, key=record.key, topic=f"{record.topic}-rare")


def hangs_at(record: Record) -> Iterator[Output]:
    """Square, but at offset ``TEST_HANG_AT`` of partition ``TEST_HANG_PARTITION`` (default
    0) sleep an hour, on every attempt: a call that never returns (a wedged client, a
    deadlock). Expected output: square_unless_hung."""
    if record.partition == int(os.environ.get("TEST_HANG_PARTITION", "0")) and \
            record.offset == int(os.environ.get("TEST_HANG_AT", "30")):
        time.sleep(3600)
    yield from square(record)


def exits_at(record: Record) -> Iterator[Output]:
    """Square, but at offset ``TEST_EXIT_AT`` of partition ``TEST_EXIT_PARTITION`` (default
    0) end the process at once, on every attempt (a crash in native code, an OOM kill):
    only ever run with TXSTAGE_WORKERS. Expected output: square_unless_exits."""
    if record.partition == int(os.environ.get("TEST_EXIT_PARTITION", "0")) and \
            record.offset == int(os.environ.get("TEST_EXIT_AT", "30")):
        os._exit(70)
    yield from square(record)


def slow_head(record: Record) -> Iterator[Output]:
    """Square; offset 0 of partition 0 takes ``TEST_HEAD_S`` seconds (default 5), every
    other record ``TEST_DELAY_MS`` (default 0)."""
    if record.partition == 0 and record.offset == 0:
        time.sleep(float(os.environ.get("TEST_HEAD_S", "5")))
    delay_ms = float(os.environ.get("TEST_DELAY_MS", "0"))
    if delay_ms:
        time.sleep(delay_ms / 1000)
    yield from square(record)


def fanout_with_faults(record: Record) -> Iterator[Output]:
    """Several outputs a record, one to ``TEST_SIDE_TOPIC``; a multiple of 7 raises after
    yielding its first output; a multiple of 11 yields an output of ``TEST_BIG_BYTES``
    (near or past the output topic's limit); a multiple of 13 yields a str value."""
    n = int(record.value or b"0")
    yield Output(value=str(n * n).encode(), key=record.key)
    if n % 7 == 0:
        raise ValueError(f"{n} is a multiple of 7")
    yield Output(value=f"side {n}".encode(), key=record.key, topic=os.environ["TEST_SIDE_TOPIC"],
                 headers=(("n", str(n).encode()),))
    if n % 11 == 0:
        yield Output(value=b"x" * int(os.environ.get("TEST_BIG_BYTES", "1048000")))
    if n % 13 == 0:
        yield Output(value=str(n))  # type: ignore[arg-type]
