"""A partition the stage wants fetched that librdkafka does not fetch.

librdkafka can leave an assigned partition unfetched without a word: no records,
no error, no log line (librdkafka#5591, open: a pause or resume whose operation is
dropped as outdated around an assignment). The stage pauses every new partition
until its position is read from Kafka, which is the pattern that report names, and
a replica can then sit with a partition never fetched while /readyz says every
partition is ready (docs/journal/2026-11-24-partition-never-fetched.md). Nothing
else would notice: the partition's lag gauge needs a fetch response.

The watch looks at the outcome, not the cause. A partition that should be fetching
(ACTIVE, no pause, no seek pending, nothing held, no job in flight) is *idle* when
its position has not moved for ``TXSTAGE_FETCH_STALL_S`` while ``consume()`` came
back short of a full batch at least twice meanwhile: its records are not waiting in
librdkafka's queue behind other partitions' (a slow transform keeps batches full).
For idle partitions the loop asks Kafka, beside the loop, for the high watermark
(ListOffsets). A fetched partition learns the high watermark from every fetch
response, even an empty one, at least every ``fetch.wait.max.ms``; librdkafka keeps
it (``get_watermark_offsets(cached=True)``). Kafka's above librdkafka's makes the
partition a *suspect*: the offsets may have been written a moment ago. It is asked
about again ``CONFIRM_S`` later (the queue having run dry twice more); if
librdkafka has still not seen the high watermark the first answer gave, no fetch
response for the partition arrived in all that time: it is *stalled*, and the loop
restarts its fetcher (pause, resume, seek to the position) and says so. (Offsets,
not records, are compared: commit markers and aborted transactions take offsets a
read_committed reader never sees, so "the last stable offset is past the position"
is true of a partition that has read everything.) A partition that stays stalled is
looked at again after twice the wait, up to an hour; an idle partition is asked
about once per wait.

Pure bookkeeping: the loop supplies the partitions, the clock and Kafka's answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Key = tuple[str, int]

MAX_WAIT_S = 3600.0
CONFIRM_S = 5.0    # from a suspect's first answer to the one that confirms it (at most)
SHORT_BATCHES = 2  # consume() calls that drained librdkafka's queue while idle


@dataclass(slots=True)
class _Seen:
    position: int
    since: float     # when the position was last seen to move (or was last asked about)
    short: int       # FetchWatch.short_batches then
    wait_s: float    # how long it must stay put before it is asked about
    suspect: int | None = None  # Kafka's high watermark, above librdkafka's

    def due(self) -> float:
        return self.since + (min(CONFIRM_S, self.wait_s) if self.suspect is not None
                             else self.wait_s)


class FetchWatch:
    def __init__(self, stall_after_s: float) -> None:
        self.stall_after_s = stall_after_s
        self.short_batches = 0  # consume() calls that returned less than a full batch
        self._seen: dict[Key, _Seen] = {}

    def idle(self, partitions: Iterable[tuple[Key, int, bool]], now: float) -> dict[Key, int]:
        """Of the partitions, as (key, position, whether it should be fetching now),
        those whose position has stayed put long enough to ask Kafka about: key ->
        position. One that should not be fetching now (paused, committing, seeking)
        waits again from now; one not among ``partitions`` is forgotten. A moved
        position starts afresh."""
        seen: dict[Key, _Seen] = {}
        idle: dict[Key, int] = {}
        for key, position, fetching in partitions:
            known = self._seen.get(key)
            if known is None or known.position != position:
                known = _Seen(position, now, self.short_batches, self.stall_after_s)
            seen[key] = known
            if not fetching:
                known.since, known.short, known.suspect = now, self.short_batches, None
            elif now >= known.due() and self.short_batches - known.short >= SHORT_BATCHES:
                idle[key] = position
        self._seen = seen
        return idle

    def stalled(self, asked: Mapping[Key, int], high: Mapping[Key, int],
                fetched_high: Mapping[Key, int], now: float) -> list[Key]:
        """Kafka's answer for the partitions ``asked`` about (key -> position then):
        ``high``, its high watermark, and ``fetched_high``, the one librdkafka last
        had from a fetch response (< 0: none yet). A suspect is a partition whose
        fetched high watermark is below Kafka's; a suspect whose fetched high
        watermark is still below what Kafka said at the previous answer is stalled.
        Every partition asked about waits again from now; a stalled one twice as
        long as before."""
        stalled = []
        for key, position in asked.items():
            known = self._seen.get(key)
            if known is None or known.position != position:
                continue  # it moved (or went) while Kafka was asked
            fetched = fetched_high.get(key, -1)
            if known.suspect is not None and fetched < known.suspect:
                stalled.append(key)
                known.wait_s = min(known.wait_s * 2, MAX_WAIT_S)
                known.suspect = None
            else:
                answer = high.get(key)
                known.suspect = answer if answer is not None and answer > fetched else None
            known.since, known.short = now, self.short_batches
        return stalled
