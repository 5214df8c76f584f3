"""Which dead letters ``txstage redrive`` takes (the letters themselves are read by
service/contract/letters.py)."""

from __future__ import annotations

from dataclasses import dataclass

from service.contract.letters import Letter


@dataclass(frozen=True, slots=True)
class Filter:
    """Which letters to redrive; every field left None matches everything."""

    error_classes: frozenset[str] | None = None
    source_topic: str | None = None
    source_partitions: frozenset[int] | None = None
    min_offset: int | None = None  # of the original record
    max_offset: int | None = None  # inclusive
    since_ms: int | None = None  # the letter's timestamp
    until_ms: int | None = None

    def __call__(self, letter: Letter, letter_timestamp: int) -> bool:
        original = letter.original
        return ((self.error_classes is None or letter.error_class in self.error_classes)
                and (self.source_topic is None or original.topic == self.source_topic)
                and (self.source_partitions is None
                     or original.partition in self.source_partitions)
                and (self.min_offset is None or original.offset >= self.min_offset)
                and (self.max_offset is None or original.offset <= self.max_offset)
                and (self.since_ms is None or letter_timestamp >= self.since_ms)
                and (self.until_ms is None or letter_timestamp < self.until_ms))
