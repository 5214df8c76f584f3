"""A partition the stage wants fetched that librdkafka does not fetch.

librdkafka can leave an assigned partition unfetched without a word: no records,
no error, no log line (librdkafka#5591, open: a pause or resume whose operation is
dropped as outdated around an assignment). The stage pauses every new partition
until its position is read from Kafka, which is the pattern that report names,
and a benchmark replica here once sat with one of its eight partitions never
fetched while /readyz said every partition was ready (docs/benchmarks.md). Nothing
else would notice: the partition's lag gauge needs a fetch response.

The watch looks at the outcome, not the cause. A partition that should be fetching
(ACTIVE, no pause, no seek pending, nothing held, no job in flight) is *idle* when
its position has not moved for ``TXSTAGE_FETCH_STALL_S`` while ``consume()`` came
back short of a full batch at least twice meanwhile: its records are not waiting in
librdkafka's queue behind other partitions' (a slow transform keeps batches full).
For idle partitions the loop asks Kafka, beside the loop, for the last stable
offset (ListOffsets, read_committed). Past the position means Kafka holds committed
records the partition never received: it is *stalled*, and the loop restarts its
fetcher (pause, resume, seek to the position) and says so. A partition that stays
stalled is asked about again after twice the wait, up to an hour; an idle partition
that is simply at the end of its input is asked about once per wait.

Pure bookkeeping: the loop supplies the partitions, the clock and Kafka's answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Key = tuple[str, int]

MAX_WAIT_S = 3600.0
SHORT_BATCHES = 2  # consume() calls that drained librdkafka's queue while idle


@dataclass(slots=True)
class _Seen:
    position: int
    since: float     # when the position was last seen to move (or was last asked about)
    short: int       # FetchWatch.short_batches then
    wait_s: float    # how long it must stay put before it is asked about


class FetchWatch:
    def __init__(self, stall_after_s: float) -> None:
        self.stall_after_s = stall_after_s
        self.short_batches = 0  # consume() calls that returned less than a full batch
        self._seen: dict[Key, _Seen] = {}

    def idle(self, fetching: Iterable[tuple[Key, int]], now: float) -> dict[Key, int]:
        """Of the partitions that should be fetching, as (key, position), those whose
        position has stayed put long enough to ask Kafka about: key -> position.
        A partition not among ``fetching`` is forgotten (its wait starts again)."""
        seen: dict[Key, _Seen] = {}
        idle: dict[Key, int] = {}
        for key, position in fetching:
            known = self._seen.get(key)
            if known is None or known.position != position:
                known = _Seen(position, now, self.short_batches, self.stall_after_s)
            seen[key] = known
            if now - known.since >= known.wait_s \
                    and self.short_batches - known.short >= SHORT_BATCHES:
                idle[key] = position
        self._seen = seen
        return idle

    def stalled(self, asked: Mapping[Key, int], offsets: Mapping[Key, tuple[int, int]],
                now: float) -> list[Key]:
        """Kafka's answer for the partitions ``asked`` about (key -> position then),
        ``offsets``: key -> (log start, last stable offset). Stalled: still at that
        position, with committed records past it (records below the log start are
        gone: from before it, fetching starts there). Every partition asked about waits
        again from now; a stalled one twice as long as before."""
        stalled = []
        for key, position in asked.items():
            known = self._seen.get(key)
            if known is None or known.position != position:
                continue  # it moved (or went) while Kafka was asked
            answer = offsets.get(key)
            if answer is not None and answer[1] > max(position, answer[0]):
                stalled.append(key)
                known.wait_s = min(known.wait_s * 2, MAX_WAIT_S)
            known.since, known.short = now, self.short_batches
        return stalled
