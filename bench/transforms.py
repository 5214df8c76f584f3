"""Transforms for the benchmarks, loaded by replicas as ``bench.transforms:<name>``
(replicas run from the repository root)."""

from __future__ import annotations

from collections.abc import Iterator

from service.records import Output, Record


def identity(record: Record) -> Iterator[Output]:
    """One output per input: the same key and value (any bytes, so 1 KB values are fine)."""
    yield Output(value=record.value, key=record.key)
