"""What an audit found: counts and a few examples per kind, as text or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

KINDS = {
    "duplicate": "outputs read twice (the same input and output index)",
    "missing": "inputs below the committed offset without (all) their outputs",
    "mismatched": "inputs whose outputs differ from what the transform makes",
    "unexpected": "outputs without an input (no lineage, an unknown input, an extra index)",
    "out_of_order": "outputs of one input partition out of input order in an output partition",
    "hanging": "open transactions holding a partition's last stable offset back",
}


@dataclass
class Violations:
    count: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class AuditReport:
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)  # input → [start, end)
    inputs: int = 0
    expected_outputs: int = 0
    outputs_read: int = 0
    outputs_ahead: int = 0  # of inputs past the committed offsets (or before the window)
    letters_pending: int = 0  # dead-lettered, the transform now succeeds, not redriven
    letters_parked: int = 0  # inputs whose letter is parked: failed --max-attempts redrives
    parked_in: dict[str, int] = field(default_factory=dict)  # parking topic → inputs
    learned_topics: list[str] = field(default_factory=list)  # written by the transform
    read_to: dict[str, str] = field(default_factory=dict)  # output partition → how far, why
    notes: list[str] = field(default_factory=list)  # what was left out, and why
    seconds: float = 0.0
    bytes_per_input: int = 10
    max_examples: int = 10
    violations: dict[str, Violations] = field(
        default_factory=lambda: {kind: Violations() for kind in KINDS})

    def add(self, kind: str, example: str) -> None:
        found = self.violations[kind]
        found.count += 1
        if len(found.examples) < self.max_examples:
            found.examples.append(example)

    @property
    def ok(self) -> bool:
        return not any(v.count for v in self.violations.values())

    @property
    def rate(self) -> float:
        """Records (inputs and outputs) audited per second."""
        return (self.inputs + self.outputs_read) / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "windows": {k: list(v) for k, v in self.windows.items()},
            "inputs": self.inputs, "expected_outputs": self.expected_outputs,
            "outputs_read": self.outputs_read, "outputs_ahead": self.outputs_ahead,
            "letters_pending": self.letters_pending, "letters_parked": self.letters_parked,
            "parked_in": self.parked_in,
            "learned_topics": self.learned_topics, "read_to": self.read_to,
            "notes": self.notes,
            "seconds": round(self.seconds, 3), "records_per_second": round(self.rate),
            "violations": {k: {"count": v.count, "examples": v.examples}
                           for k, v in self.violations.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def summary(self) -> str:
        lines = [f"audited {self.inputs} inputs in {len(self.windows)} partition(s) and "
                 f"{self.outputs_read} records of the output, dead-letter and parking topics "
                 f"in {self.seconds:.1f} s ({self.rate:,.0f} records/s; the transform ran "
                 f"on every input, so its speed bounds this)",
                 f"expected outputs {self.expected_outputs}: what the transform makes of the "
                 f"inputs now, a dead letter for each it fails on. The records read also "
                 f"count dead letters standing for outputs (refused at write time, or not "
                 f"redriven yet), the letters beside redriven outputs, and parked letters: "
                 f"the two counts differ while such letters exist",
                 f"outputs of inputs outside the window (newer than the committed offsets): "
                 f"{self.outputs_ahead}",
                 f"dead letters the transform now handles, not redriven yet: "
                 f"{self.letters_pending}; parked by redrive (accounted for): "
                 f"{self.letters_parked}" + (" ({})".format(", ".join(
                     f"{count} in {topic}" for topic, count in sorted(self.parked_in.items())))
                     if self.parked_in else "")]
        if self.learned_topics:
            lines.append(f"topics the transform writes, audited too: "
                         f"{', '.join(self.learned_topics)}")
        held = {k: v for k, v in self.read_to.items() if "transaction is open" in v}
        lines.append(f"output partitions: {len(self.read_to)} read to their end"
                     if not held else f"output partitions: {len(self.read_to) - len(held)} "
                     f"read to their end, {len(held)} to their last stable offset")
        lines += [f"  {partition}: {how}" for partition, how in sorted(held.items())]
        lines += [f"note: {note}" for note in self.notes]
        for kind, description in KINDS.items():
            found = self.violations[kind]
            mark = "ok " if found.count == 0 else "BAD"
            lines.append(f"  {mark} {kind:<13} {found.count:>8}  {description}")
            lines += [f"        e.g. {example}" for example in found.examples]
        lines.append("exactly-once: CLEAN" if self.ok else "exactly-once: VIOLATED")
        return "\n".join(lines)
