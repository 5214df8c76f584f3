"""Transforms for the benchmarks, loaded by replicas as ``bench.transforms:<name>``
(replicas run from the repository root)."""

from __future__ import annotations

from collections.abc import Iterator

from service.contract.records import Output, Record


def identity(record: Record) -> Iterator[Output]:
    """One output per input: the same key and value (any bytes, so 1 KB values are fine)."""
    yield Output(value=record.value, key=record.key)


def identity_failing_every_hundredth(record: Record) -> Iterator[Output]:
    """identity, with a bug: the value ``<i>:...`` fails when i is a multiple of 100 (a
    dead letter each). ``BENCH_TRANSFORM_FIXED`` set: fixed (for redrive)."""
    import os

    if not os.environ.get("BENCH_TRANSFORM_FIXED"):
        number = (record.value or b"").split(b":", 1)[0]
        if number.isdigit() and int(number) % 100 == 0:
            raise ValueError(f"record {int(number)} is a multiple of 100")
    yield Output(value=record.value, key=record.key)
