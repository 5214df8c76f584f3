"""Dead letters read back, as redrive and the backfill's parity read them: the
original record rebuilt, and the headers redrive adds.

A dead letter (service/contract/deadletter.py, processing._dead_letter) is the original record's
key, value and headers followed by the five ``txstage.error.*`` headers naming the error
and the original coordinates and the two lineage headers of that original, in that
order (a letter redrive writes again has ``txstage.redrive.attempt`` after them, and
one it parks ``txstage.redrive.parked`` after that).
Redrive rebuilds the original ``Record`` from them: its headers are those before that
suffix, whatever their names (an input written by another txstage stage carries its
own ``txstage.src`` and ``txstage.idx``; they are the record's, kept), and its
timestamp becomes the letter's (the original's is not kept). It marks

- every output it writes with ``txstage.redriven`` = the letter's own coordinates
  (``<dlq topic>/<partition>/<offset>``), so ``txstage audit`` accepts a dead letter
  *and* the outputs that replaced it;
- a letter it writes again (the transform still fails) with ``txstage.redrive.attempt``
  = the previous attempt + 1;
- a letter whose attempt reaches ``--max-attempts`` (written to the parking topic
  instead of the DLQ) also with ``txstage.redrive.parked`` = ``1``. It stays a letter
  ``parse`` reads, so the parking topic can itself be redriven once the cause is fixed.

Parking is one place (``parking_topic_of``): the parking topic of ``<dlq>`` is
``<dlq>.parked``, and that of a topic already named ``*.parked`` is the topic itself, so
redriving a parking topic never nests another. A parked letter that fails again is left
where it is (service/tools/redrive/run.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.contract import lineage
from service.contract.deadletter import (
    DROPPED,
    ERROR_CLASS,
    ERROR_MESSAGE,
    ERROR_OFFSET,
    ERROR_PARTITION,
    ERROR_TOPIC,
    dropped_parts,
)
from service.contract.records import Record

REDRIVEN = lineage.REDRIVEN
ATTEMPT = lineage.REDRIVE_ATTEMPT
PARKED = "txstage.redrive.parked"
PARKING_SUFFIX = ".parked"
# What the stage appends to the original record's headers, in this order.
_APPENDED = (ERROR_CLASS, ERROR_MESSAGE, ERROR_TOPIC, ERROR_PARTITION, ERROR_OFFSET,
             lineage.SRC, lineage.IDX)
# The same, for a letter cut to fit its topic (deadletter.DROPPED before the lineage).
_APPENDED_CUT = (*_APPENDED[:5], DROPPED, *_APPENDED[5:])


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter: where it is, the original record, why it failed."""

    topic: str
    partition: int
    offset: int
    original: Record
    error_class: str
    attempt: int  # 0: written by the stage; n: by the n-th redrive of its original
    # What the letter left out of the original to fit its topic (deadletter.DROPPED):
    # such a letter cannot be redriven, the original is not all there.
    dropped: frozenset[str] = frozenset()
    parked: bool = False  # written to the parking topic, having reached --max-attempts

    @property
    def coordinates(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


def parking_topic_of(dlq_topic: str) -> str:
    """Where redrive parks the letters of ``dlq_topic``: ``<dlq>.parked``, or the topic
    itself when it is a parking topic already (no ``.parked.parked``)."""
    return dlq_topic if dlq_topic.endswith(PARKING_SUFFIX) else dlq_topic + PARKING_SUFFIX


def parking_topics(dlq_topic: str, exists: Callable[[str], bool]) -> list[str]:
    """The parking topics of ``dlq_topic`` that exist: ``<dlq>.parked``, and the
    ``<dlq>.parked.parked``... that redrives of a parking topic created before parking
    was kept in one place (their letters are parked letters all the same)."""
    found: list[str] = []
    topic = dlq_topic + PARKING_SUFFIX
    while exists(topic):
        found.append(topic)
        topic += PARKING_SUFFIX
    return found


def parse(topic: str, partition: int, offset: int, timestamp: int, key: bytes | None,
          value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> Letter | None:
    """The letter, or None when the record is not a txstage dead letter (its headers do
    not end with what the stage appends)."""
    end = len(headers)
    parked = bool(end) and headers[-1][0] == PARKED
    if parked:
        end -= 1
    attempt: bytes | None = b"0"
    if end and headers[end - 1][0] == ATTEMPT:
        end, attempt = end - 1, headers[end - 1][1]
    for appended in (_APPENDED, _APPENDED_CUT):
        start = end - len(appended)
        if start >= 0 and tuple(name for name, _ in headers[start:end]) == appended:
            break
    else:
        return None
    found = dict(headers[start:end])
    try:
        original = Record(topic=_text(found[ERROR_TOPIC]),
                          partition=int(_data(found[ERROR_PARTITION])),
                          offset=int(_data(found[ERROR_OFFSET])), timestamp=timestamp, key=key,
                          value=value,
                          # A null value as the stage read it (messages.to_record).
                          headers=tuple((n, d or b"") for n, d in headers[:start]))
        return Letter(topic, partition, offset, original, _text(found[ERROR_CLASS]),
                      int(_data(attempt)), dropped_parts(headers[start:end]), parked)
    except ValueError:
        return None


def _data(data: bytes | None) -> bytes:
    if data is None:
        raise ValueError("a null header value")
    return data


def _text(data: bytes | None) -> str:
    return _data(data).decode()
