"""Where one partition's fetching stands after a seek: pure bookkeeping, no Kafka
call (``Positions`` makes the calls and keeps one of these per partition).

A seek is checked, not trusted (docs/state-machine.md, "A seek is checked, not
trusted"): a seek librdkafka refused because the partition is not fetching yet is
retried until it lands (the partition stays paused); then the first record fetched
after it must be at the sought offset."""

from __future__ import annotations


class Positioning:
    """One partition's seek, from the moment it is made to its first record checked."""

    __slots__ = ("check_first", "rechecked", "refused_since", "seek_batch", "seek_to",
                 "sought", "started_at")

    def __init__(self) -> None:
        self.seek_to: int | None = None            # a seek not landed yet (refused: retried)
        self.refused_since: float | None = None    # tick time of its first refusal
        self.sought = -1                           # the offset last sought (< 0: none committed)
        # Nothing committed and auto.offset.reset=latest: the first record's offset,
        # sought instead of the end while nothing is committed.
        self.started_at: int | None = None
        self.check_first = False                   # the first record after it is to be checked
        self.rechecked: int | None = None          # that record's offset, from beyond the seek
        self.seek_batch = -1                       # the consume() batch the seek was made in

    def sought_at(self, offset: int, batch: int) -> int:
        """A seek to ``offset`` (< 0: nothing committed) in consume() batch ``batch``;
        where the partition's position goes (where it started, when nothing was
        committed and that is known)."""
        if offset < 0 and self.started_at is not None:
            offset = self.started_at
        self.seek_to = self.sought = offset
        self.check_first = True
        self.seek_batch = batch  # what this batch holds was fetched before it
        self.rechecked = None
        return offset

    def landed(self) -> None:
        self.seek_to = self.refused_since = None

    @property
    def landing(self) -> bool:
        """A seek is made and has not landed yet: the partition stays paused."""
        return self.seek_to is not None

    @property
    def settled(self) -> bool:
        """Landed and its first record checked: records may flow unchecked."""
        return self.seek_to is None and not self.check_first

    def stale(self, batch: int) -> bool:
        """Whatever the partition fetched now predates a seek (pending, or made in
        consume() batch ``batch``): it is read again."""
        return self.seek_to is not None or self.seek_batch == batch

    def first_checked(self) -> None:
        self.check_first, self.rechecked = False, None

    def restart_at(self, position: int) -> int:
        """Where a restarted fetcher seeks: the position, or what was last sought
        when nothing has been read yet (its offset is not known)."""
        return self.sought if self.sought < 0 and position == 0 else position
