"""One input record → the exact records to write: shared by the stream and the backfill.

Kafka-free on purpose: the stage and the Spark backfill call the same function,
so the backfill's output equals the stream's record for record (parity).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, cast

from service.contract import lineage
from service.contract.deadletter import dead_letter
from service.contract.records import Output, Record, Transform
from service.errors import KafkaOperationError, PoisonRecordError, TxstageError

# Record batch + record framing the broker counts against max.message.bytes on
# top of key, value and headers; generous so a borderline record is refused here,
# where it can be dead-lettered, rather than by the broker, which would abort.
FRAMING_BYTES = 512


class TopicLimitPending(TxstageError):
    """An output goes to a topic whose size limit is not known yet. The stage looks
    it up beside the loop and processes the record again afterwards, from
    ``outputs`` (what the transform yielded for it, set by ``processing.process``)
    rather than calling the transform a second time."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.outputs: list[Output] | None = None
        # What the stage runs beside the loop instead of looking the topic up (a schema
        # registry lookup: service.formats); None: the topic's limits.
        self.lookup: Callable[[], object] | None = None
        super().__init__(f"the limits of topic {topic!r} are being looked up")


class OutputTooLargeError(ValueError):
    """An output exceeds what its topic accepts (``max.message.bytes``)."""


class Produced(NamedTuple):
    """A fully resolved output: topic chosen, lineage stamped. (A tuple: one is
    built per output on the hot path.)"""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


# An input record and the outputs to write for it: a flowing partition's records are
# written a run at a time (Guarantee.write_run), one call per partition per fetch.
Processed = tuple[Record, list[Produced]]


def written_before(run: Sequence[Processed], offset: int | None) -> int:
    """How many records of ``run`` come before the one at ``offset``: those a write
    that failed at ``offset`` had written (0 when no record is at ``offset``)."""
    return next((i for i, (record, _) in enumerate(run) if record.offset == offset), 0)


class Result(NamedTuple):
    """What to write for one input; ``error`` is set when it was dead-lettered."""

    outputs: list[Produced]
    error: BaseException | None = None

    @property
    def dead_lettered(self) -> bool:
        return self.error is not None


class OutputRefusedError(ValueError):
    """The broker refused an output of this record (e.g. a keyless record for a
    compacted topic): retrying cannot help, the record is poison."""


class TransformTimeoutError(TimeoutError):
    """Calls of the transform on this record overran TXSTAGE_TRANSFORM_TIMEOUT_MS as
    many times as a record may be attempted: it is not called again."""


def refused(record: Record, error: OutputRefusedError | TransformTimeoutError,
            dlq_topic: str | None, max_bytes: Callable[[str], int] | None = None) -> Result:
    """The dead letter for a record whose outputs the broker refused, or whose transform
    calls overran; raises PoisonRecordError without a dead-letter topic (the same policy
    as a failing transform)."""
    if not dlq_topic:
        raise PoisonRecordError(record.topic, record.partition, record.offset, error)
    return _dead_letter(record, error, dlq_topic, max_bytes)


def _dead_letter(record: Record, error: BaseException, dlq_topic: str,
                 max_bytes: Callable[[str], int] | None) -> Result:
    """The letter, built to fit the dead-letter topic's limit (``max_bytes``) with its
    lineage headers and framing: no record's bytes can keep it from being written."""
    src = lineage.source_of(record.topic, record.partition, record.offset)
    room = None if max_bytes is None else \
        max_bytes(dlq_topic) - (_LINEAGE_BYTES + len(src) + len(_INDEX[0]))
    letter = dead_letter(record, error, dlq_topic, room)
    headers = lineage.stamp(letter.headers, src, 0)
    return Result([Produced(dlq_topic, letter.key, letter.value, headers)], error)


def size_of(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    return (len(key or b"") + len(value or b"") + FRAMING_BYTES
            + sum(len(name) + len(data) for name, data in headers))


# ``Produced(...)`` and ``Result(...)`` on the hot path: a NamedTuple's ``__new__`` is
# a Python function (for its defaults); the tuple's own is not
# (docs/journal/2026-11-26-contract-objects-from-slots.md).
_new = tuple.__new__


def process(
    transform: Transform,
    record: Record,
    *,
    default_topic: str,
    dlq_topic: str | None,
    max_bytes: Callable[[str], int],
) -> Result:
    """Apply ``transform`` to ``record``; dead-letter it on failure when a DLQ is set.

    Raises PoisonRecordError when the record fails and there is no DLQ.
    """
    src = f"{record.topic}/{record.partition}/{record.offset}".encode()  # lineage.source_of
    try:
        outputs = _resolve(transform(record), src, default_topic, max_bytes)
    except (KafkaOperationError, TopicLimitPending):
        raise  # the cluster failed us, or must be asked first: not the record's fault
    except Exception as exc:
        if not dlq_topic:
            raise PoisonRecordError(record.topic, record.partition, record.offset, exc) from exc
        return _dead_letter(record, exc, dlq_topic, max_bytes)
    return _new(Result, (outputs, None))


_LINEAGE_BYTES = FRAMING_BYTES + len(lineage.SRC) + len(lineage.IDX)
_INDEX = [str(i).encode() for i in range(16)]


def _resolve(
    outputs: Iterable[object], src: bytes, default_topic: str, max_bytes: Callable[[str], int]
) -> list[Produced]:
    """The hot path (one call per input record): checks and stamps each output the
    way ``_check_bytes``, ``lineage.stamp`` and ``size_of`` say, inlined."""
    resolved: list[Produced] = []
    lineage_size = _LINEAGE_BYTES + len(src)
    remaining = iter(outputs)
    for index, out in enumerate(remaining):
        if type(out) is not Output and not isinstance(out, Output):
            raise TypeError(f"the transform yielded a {type(out).__name__}, not service.Output")
        key, value, extra = out.key, out.value, out.headers
        if not ((key is None or type(key) is bytes) and (value is None or type(value) is bytes)):
            _check_bytes(out)
        idx = _INDEX[index] if index < 16 else str(index).encode()
        size = lineage_size + len(idx) + (len(key) if key else 0) + (len(value) if value else 0)
        if extra:
            _check_bytes(out)
            size += sum(len(name) + len(data) for name, data in extra)
            headers = [*extra, (lineage.SRC, src), (lineage.IDX, idx)]
        else:
            headers = [(lineage.SRC, src), (lineage.IDX, idx)]
        topic = out.topic or default_topic
        try:
            limit = max_bytes(topic)
        except TopicLimitPending as pending:
            # The record is held until the topic is looked up, then processed again
            # from what the transform yielded, which it does not run a second time.
            # (What follows ``out`` is checked then, as any transform's outputs are.)
            pending.outputs = [*(Output(p.value, p.key, p.topic, tuple(p.headers[:-2]))
                                 for p in resolved), out, *cast(Iterator[Output], remaining)]
            raise
        if size > limit:
            raise OutputTooLargeError(
                f"output {index} for topic {topic!r} is about {size} bytes; "
                f"the limit is {limit} bytes"
            )
        resolved.append(_new(Produced, (topic, key, value, headers)))
    return resolved


def _check_bytes(out: Output) -> None:
    key, value = out.key, out.value
    if not (key is None or type(key) is bytes) or not (value is None or type(value) is bytes):
        name, field = ("key", key) if not (key is None or type(key) is bytes) else ("value", value)
        raise TypeError(f"Output.{name} must be bytes or None, not {type(field).__name__}")
    for header in out.headers:
        if not (isinstance(header, tuple) and len(header) == 2
                and isinstance(header[0], str) and isinstance(header[1], bytes)):
            raise TypeError(f"Output.headers must be (str, bytes) pairs, got {header!r}")
