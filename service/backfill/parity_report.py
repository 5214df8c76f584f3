"""What ``txstage backfill verify`` found (service/backfill/parity.py compares): the
kinds of difference, the dead letters redrive lineage reconciled, the parked letters,
as a report for a person or a machine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

Key = tuple[str, int]  # (txstage.src, txstage.idx)
FIELDS = ("topic", "key", "value", "headers")
EXAMPLES = 5  # per kind of difference, in the report

# The kinds of difference, in the order the report lists them: ParityReport's list
# fields and their words.
_KINDS = (
    ("missing", "missing"),
    ("extra", "extra"),
    ("different", "different"),
    ("dead_lettered_expected", "dead-lettered in expected only"),
    ("dead_lettered_actual", "dead-lettered in actual only"),
    ("duplicated_expected", "duplicated in expected"),
    ("duplicated_actual", "duplicated in actual"),
)


@dataclass(slots=True)
class Reconciled:
    """Dead letters of one side that a later generation of their input replaced."""

    by_redriven: int = 0  # by the outputs txstage redrive wrote in their place
    by_later_attempt: int = 0  # by the letter redrive wrote again (or parked)

    def __bool__(self) -> bool:
        return bool(self.by_redriven or self.by_later_attempt)

    def describe(self) -> str:
        redriven, later = self.by_redriven, self.by_later_attempt
        by_redriven = f"replaced by {'its' if redriven == 1 else 'their'} redriven outputs"
        if redriven and later:
            return f"{_plural(redriven, 'letter')} {by_redriven}, {later} by a later attempt"
        if redriven:
            return f"{_plural(redriven, 'letter')} {by_redriven}"
        return f"{_plural(later, 'letter')} replaced by a later attempt"


@dataclass(slots=True)
class ParityReport:
    expected: int = 0  # outputs read (within the range), replaced letters included
    actual: int = 0
    matching: int = 0  # keys whose standing records are equal on both sides
    missing: list[Key] = field(default_factory=list)
    extra: list[Key] = field(default_factory=list)
    different: list[tuple[Key, tuple[str, ...]]] = field(default_factory=list)
    # A letter on this side where the other has an output: e.g. not redriven yet.
    dead_lettered_expected: list[Key] = field(default_factory=list)
    dead_lettered_actual: list[Key] = field(default_factory=list)
    duplicated_expected: list[Key] = field(default_factory=list)  # one per extra copy
    duplicated_actual: list[Key] = field(default_factory=list)
    unstamped_expected: int = 0
    unstamped_actual: int = 0
    reconciled_expected: Reconciled = field(default_factory=Reconciled)
    reconciled_actual: Reconciled = field(default_factory=Reconciled)
    # Standing parked letters, by the topic holding them (not differences).
    parked_expected: dict[str, int] = field(default_factory=dict)
    parked_actual: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        found = {name: len(getattr(self, name)) for name, _ in _KINDS}
        found["unstamped_expected"] = self.unstamped_expected
        found["unstamped_actual"] = self.unstamped_actual
        return found

    @property
    def ok(self) -> bool:
        return not any(self.counts().values())

    def problems(self) -> list[str]:
        """One line per kind of difference found: how many, and a few examples."""
        found = []
        for name, words in _KINDS:
            count = len(getattr(self, name))
            if not count:
                continue
            line = f"{words} {count}"
            fields = self.different_fields() if name == "different" else ()
            if fields:
                line += f" ({', '.join(fields)})"
            shown = [_where(key) + (f" ({', '.join(more)})" if len(fields) > 1 else "")
                     for key, more in self._examples(name)]
            found.append(f"{line}, e.g. {', '.join(shown)}")
        found += [f"without lineage in {side} {count}" for side, count in
                  (("expected", self.unstamped_expected), ("actual", self.unstamped_actual))
                  if count]
        return found

    def lines(self) -> list[str]:
        """The report for a person: the verdict, then what differs, what was read and
        what redrive lineage was reconciled."""
        problems = self.problems()
        match = f"{_plural(self.matching, 'output')} {'matches' if self.matching == 1 else 'match'}"
        head = f"DIFFERENT: {_plural(sum(self.counts().values()), 'difference')}; {match}" \
            if problems else f"EQUAL: {match}"
        found = [head, *(f"  {problem}" for problem in problems),
                 f"  read {self.expected} expected outputs, {self.actual} actual"]
        found += [f"  redrive ({side}): {reconciled.describe()}" for side, reconciled in
                  (("expected", self.reconciled_expected), ("actual", self.reconciled_actual))
                  if reconciled]
        found += [f"  parked ({side}): " + ", ".join(
                      f"{_plural(count, 'letter')} in {topic}"
                      for topic, count in sorted(parked.items()))
                  for side, parked in (("expected", self.parked_expected),
                                       ("actual", self.parked_actual)) if parked]
        return found

    def as_dict(self) -> dict[str, Any]:
        """The report for a machine (``--json``)."""
        return {
            "verdict": "EQUAL" if self.ok else "DIFFERENT",
            "matching": self.matching, "expected": self.expected, "actual": self.actual,
            "counts": self.counts(), "different_fields": list(self.different_fields()),
            "examples": {name: [{"input": key[0], "output": key[1]}
                                | ({"fields": list(fields)} if name == "different" else {})
                                for key, fields in self._examples(name)]
                         for name, _ in _KINDS},
            "redrive": {"expected": asdict(self.reconciled_expected),
                        "actual": asdict(self.reconciled_actual)},
            "parked": {"expected": self.parked_expected, "actual": self.parked_actual},
        }

    def different_fields(self) -> tuple[str, ...]:
        seen = {name for _, fields in self.different for name in fields}
        return tuple(name for name in FIELDS if name in seen)

    def _examples(self, kind: str) -> list[tuple[Key, tuple[str, ...]]]:
        if kind == "different":
            return self.different[:EXAMPLES]
        keys: list[Key] = getattr(self, kind)
        return [(key, ()) for key in list(dict.fromkeys(keys))[:EXAMPLES]]


def _where(key: Key) -> str:
    return f"{key[0]} output {key[1]}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
