"""What the audit keeps per input partition, in flat arrays indexed by the input offset
within the window, so memory is a few bytes per input record however large the topics:

- ``expected``  how many outputs the transform makes of the input (1 byte; more than
                254 spill into a dict)
- ``seen``      which output indexes 0..7 were read (a 1-byte mask; higher indexes and
                their duplicates spill into a set)
- ``want`` / ``got``  a 32-bit XOR of the digests of the expected / read outputs'
                topic, key and value (content check)

≈10 bytes per input record: 10 M inputs in the window ≈ 100 MB. A few Python objects
per *violation* and per *dead letter* come on top (sets: dead letters are rare).

Dead letters: an input the transform fails on *now* must have a dead letter (and no
output). An input it succeeds on may also have letters — from when it failed, before a
fix — with either no outputs yet (``pending``: not redriven yet, not a violation) or
the outputs ``txstage redrive`` wrote, marked ``txstage.redriven``. A letter written at
write time instead of outputs (refused by the broker, too large, to a topic that does
not exist) stands for them: it is not pending, and the outputs redrive writes once the
cause is fixed replace it the same way. Outputs *and* a letter without that mark are a
duplicate. Letters of one input, of either kind, differ by their redrive attempt (the
stage writes attempt 0, the n-th redrive n); two of the same attempt are a duplicate.
An input whose latest letter is parked (``txstage.redrive.parked``) and that has no
redriven outputs is *parked*: accounted for, and where (the letter's topic) is kept.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterator
from enum import Enum

_WIDE = 255  # ``expected`` byte meaning "see the overflow dict"
_MASK_BITS = 8


class Finding(Enum):
    DUPLICATE = "duplicate"  # an (input, index) pair read twice
    UNEXPECTED = "unexpected"  # an output index the transform does not make for that input
    MISSING = "missing"  # an input below the committed offset without one of its outputs
    MISMATCHED = "mismatched"  # outputs present, content differs from the transform's
    PENDING = "pending"  # dead-lettered, the transform now succeeds, not redriven yet


def digest(index: int, topic: str, key: bytes | None, value: bytes | None) -> int:
    """32-bit digest of one output as the audit compares it (headers aside)."""
    crc = zlib.crc32(b"%d\0%s\0" % (index, topic.encode()))
    crc = zlib.crc32(b"\1" + key if key is not None else b"\0", crc)
    return zlib.crc32(b"\1" + value if value is not None else b"\0", crc)


class PartitionLedger:
    """The window ``[start, end)`` of one input partition."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, max(start, end)
        size = self.end - self.start
        self.expected = bytearray(size)
        self.seen = bytearray(size)
        self.want = array("I", bytes(4 * size))
        self.got = array("I", bytes(4 * size))
        self._wide: dict[int, int] = {}
        self._seen_high: set[tuple[int, int]] = set()
        self._replaced: set[int] = set()  # a write-time dead letter stands for its outputs
        self._must_letter: set[int] = set()  # the transform fails on it now
        self._letters: dict[int, set[int]] = {}  # dead letters seen (either kind): attempts
        self._redriven: set[int] = set()  # outputs written by txstage redrive
        self._parked: dict[int, tuple[int, str]] = {}  # parked letters: attempt, topic

    def __contains__(self, offset: int) -> bool:
        return self.start <= offset < self.end

    def expect(self, offset: int, digests: list[int]) -> None:
        """The transform makes ``len(digests)`` outputs of the input at ``offset``."""
        i = offset - self.start
        count = len(digests)
        if count >= _WIDE:
            self._wide[i] = count
            count = _WIDE
        self.expected[i] = count
        combined = 0
        for d in digests:
            combined ^= d
        self.want[i] = combined

    def expect_letter(self, offset: int) -> None:
        """The transform fails on the input at ``offset``: it must be dead-lettered."""
        self._must_letter.add(offset - self.start)

    def letter(self, offset: int, attempt: int, *, replaces_outputs: bool = False,
               parked_in: str | None = None) -> Finding | None:
        """A dead letter of the input at ``offset`` was read (``attempt``: 0 from the
        stage, n from the n-th redrive). ``replaces_outputs``: it was written instead of
        outputs at write time (the broker refused one, one was too large, or its topic
        did not exist), which the transform alone cannot foresee: it stands for them.
        ``parked_in``: the letter is a parked one, read in that topic."""
        i = offset - self.start
        attempts = self._letters.setdefault(i, set())
        if attempt in attempts:
            return Finding.DUPLICATE
        attempts.add(attempt)
        if parked_in is not None and attempt >= self._parked.get(i, (-1, ""))[0]:
            self._parked[i] = (attempt, parked_in)
        if replaces_outputs:
            self._replaced.add(i)
        return None

    def see(self, offset: int, index: int, output_digest: int, *,
            redriven: bool = False) -> Finding | None:
        """An output of the input at ``offset`` was read (``redriven``: written by
        ``txstage redrive``, in place of a dead letter)."""
        i = offset - self.start
        if redriven:
            self._redriven.add(i)
        if index < _MASK_BITS:
            bit = 1 << index
            if self.seen[i] & bit:
                return Finding.DUPLICATE
            self.seen[i] |= bit
        else:
            if (i, index) in self._seen_high:
                return Finding.DUPLICATE
            self._seen_high.add((i, index))
        if index >= self._expected(i):
            return Finding.UNEXPECTED
        self.got[i] ^= output_digest
        return None

    def parked(self) -> Iterator[tuple[int, str]]:
        """(input offset, topic) of each input whose latest letter is parked and that
        redrive has not since written outputs for."""
        for i, (attempt, topic) in self._parked.items():
            if i not in self._redriven and attempt == max(self._letters[i]):
                yield self.start + i, topic

    def _expected(self, i: int) -> int:
        count = self.expected[i]
        return self._wide[i] if count == _WIDE else count

    def findings(self) -> Iterator[tuple[Finding, int]]:
        """Inputs whose outputs are missing, differ, or stand beside a dead letter, once
        every output was seen; and inputs dead-lettered but not redriven (PENDING)."""
        for i in range(self.end - self.start):
            letters = self._letters.get(i)
            if i in self._replaced and i not in self._redriven:
                if self.seen[i] or any(k == i for k, _ in self._seen_high):
                    yield Finding.DUPLICATE, self.start + i  # outputs and their dead letter
                continue
            # Redriven outputs replace a write-time letter: checked as any outputs are.
            if i in self._must_letter:
                if not letters:
                    yield Finding.MISSING, self.start + i
                continue  # an output beside it was UNEXPECTED when read (0 expected)
            count = self._expected(i)
            if count == 0:
                continue
            low = (1 << min(count, _MASK_BITS)) - 1
            if letters and not self.seen[i] and i not in self._redriven:
                yield Finding.PENDING, self.start + i
            elif self.seen[i] & low != low or any(
                    (i, index) not in self._seen_high for index in range(_MASK_BITS, count)):
                yield Finding.MISSING, self.start + i
            elif self.got[i] != self.want[i]:
                yield Finding.MISMATCHED, self.start + i
            elif letters and i not in self._redriven:
                yield Finding.DUPLICATE, self.start + i  # outputs and a dead letter
