"""Lineage headers stamped on every output: they make exactly-once checkable.

``txstage.src`` = ``<topic>/<partition>/<offset>`` of the input record and
``txstage.idx`` = the output's index among that input's outputs. The pair is
unique per output if and only if nothing was duplicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from service.contract.records import Headers

SRC = "txstage.src"
IDX = "txstage.idx"
# Marks of `txstage redrive` (service/tools/redrive): on an output, the dead letter it replaces
# (``<dlq topic>/<partition>/<offset>``); on a letter written again, its attempt number.
REDRIVEN = "txstage.redriven"
REDRIVE_ATTEMPT = "txstage.redrive.attempt"


class Lineage(NamedTuple):
    topic: str
    partition: int
    offset: int
    idx: int


def source_of(topic: str, partition: int, offset: int) -> bytes:
    return f"{topic}/{partition}/{offset}".encode()


def stamp(headers: Headers, src: bytes, index: int) -> list[tuple[str, bytes]]:
    """The output's own headers followed by the two lineage headers."""
    return [*headers, (SRC, src), (IDX, str(index).encode())]


def read(headers: Iterable[tuple[str, bytes | None]] | None) -> Lineage | None:
    """Parse the lineage headers of an output; ``None`` if it carries none."""
    src = idx = None
    for name, value in headers or ():
        if name == SRC and value is not None:
            src = value.decode()
        elif name == IDX and value is not None:
            idx = int(value)
    if src is None or idx is None:
        return None
    topic, partition, offset = src.rsplit("/", 2)
    return Lineage(topic, int(partition), int(offset), idx)
