"""The plan of a job: its id and its slices, fixed before any record is read.

A slice is a contiguous offset range ``[start, end)`` of one input partition. Slice
boundaries fall on multiples of ``slice_records`` (``offset // slice_records`` names the
chunk), so the same input always cuts into the same slices, whatever the source. Each
slice is written by one transactional producer whose id is derived from the job id and
the slice index: that pairing is what makes a retried task resume instead of duplicate,
so a job's plan is stored with its progress and reused when the job is run again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from service.errors import ConfigError

JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
DEFAULT_SLICE_RECORDS = 1_000_000


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one input partition; ``records`` when counted (files)."""

    topic: str
    partition: int
    start: int
    end: int
    records: int | None = None


@dataclass(frozen=True, slots=True)
class Slice:
    index: int
    topic: str
    partition: int
    start: int  # first input offset, inclusive
    end: int  # exclusive
    records: int | None = None  # exact for file sources; a Kafka range holds at most end-start

    @property
    def span(self) -> int:
        return self.end - self.start

    def contains(self, offset: int) -> bool:
        return self.start <= offset < self.end


@dataclass(frozen=True, slots=True)
class Plan:
    job_id: str
    fingerprint: str  # of the job's definition: source, sink, transform, topics
    slice_records: int
    slices: tuple[Slice, ...]

    @property
    def max_records(self) -> int:
        return sum(s.span if s.records is None else s.records for s in self.slices)

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "fingerprint": self.fingerprint,
                "slice_records": self.slice_records,
                "slices": [asdict(s) for s in self.slices]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Plan:
        slices = tuple(Slice(**s) for s in doc["slices"])
        return cls(str(doc["job_id"]), str(doc["fingerprint"]), int(doc["slice_records"]),
                   slices)


def slice_ranges(ranges: Iterable[PartitionRange], slice_records: int) -> tuple[Slice, ...]:
    """Cut each range at multiples of ``slice_records``; empty ranges give no slice.

    Slices are numbered in (topic, partition, start) order, so the numbering depends on
    the input only.
    """
    cut: list[tuple[str, int, int, int, int | None]] = []
    for r in ranges:
        if r.records is not None:  # counted per chunk already (file sources)
            if r.records > 0:
                cut.append((r.topic, r.partition, r.start, r.end, r.records))
            continue
        start = r.start
        while start < r.end:
            end = min(r.end, (start // slice_records + 1) * slice_records)
            cut.append((r.topic, r.partition, start, end, None))
            start = end
    return tuple(Slice(i, *fields) for i, fields in enumerate(sorted(cut, key=lambda c: c[:3])))


def fingerprint(definition: Mapping[str, str | int | None]) -> str:
    canonical = json.dumps(dict(definition), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def default_job_id(digest: str) -> str:
    """Derived from the definition, so re-running the same command resumes the same job."""
    return f"bf-{digest[:16]}"


def check_job_id(job_id: str) -> str:
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise ConfigError(
            f"--job-id {job_id!r}: use 1-100 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit"
        )
    return job_id


def transactional_id(prefix: str, job_id: str, index: int) -> str:
    """The producer identity of one slice: a retried attempt of it fences the previous."""
    return f"{prefix}.backfill.{job_id}.{index}"


def same_slices(a: Sequence[Slice], b: Sequence[Slice]) -> bool:
    return list(a) == list(b)
