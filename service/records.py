"""The transform contract: what a transform receives and what it returns.

Nothing here imports Kafka, so the same function runs in the stream stage and in
the PySpark backfill unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Record:
    """One input record, as read (read_committed) from an input partition."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class Output:
    """One output record. ``topic=None`` means the configured output topic."""

    value: bytes | None
    key: bytes | None = None
    topic: str | None = None
    headers: Headers = ()


Transform = Callable[[Record], Iterable[Output]]
"""A pure function from one input record to zero or more outputs."""
