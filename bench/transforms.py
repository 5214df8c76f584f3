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


# sha256 rounds of sha256_heavy: with its JSON, ~150 µs a record of 1 KB on the 2-core
# box (python -m bench.workers --calibrate measures it)
HEAVY_ROUNDS = 390


def sha256_heavy(record: Record) -> Iterator[Output]:
    """A CPU-bound transform of ~150 µs a record, pure and deterministic: the value as a
    JSON document, hashed ``HEAVY_ROUNDS`` times, and a JSON output with the digest."""
    import hashlib
    import json

    value = record.value or b""
    document = json.loads(json.dumps({"key": (record.key or b"").decode("latin-1"),
                                      "value": value.decode("latin-1"),
                                      "offset": record.offset}))
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).digest()
    for _ in range(HEAVY_ROUNDS):
        digest = hashlib.sha256(digest).digest()
    yield Output(value=json.dumps({"key": document["key"], "digest": digest.hex(),
                                   "size": len(value)}).encode(), key=record.key)
