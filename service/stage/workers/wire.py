"""What crosses between the main process and a worker: plain tuples (a pickle round
trip of a frozen dataclass costs about six times a tuple's), and a transform's
failure as its class's name and message, rebuilt in the main process so that its
dead letter is byte for byte the one the in-process run writes."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from confluent_kafka import Message

from service.contract.records import Headers, Output

# A record: (topic, partition, offset, timestamp, key, value, headers)
WireRecord = tuple[str, int, int, int, bytes | None, bytes | None, Headers]
# A failure: (module, qualified name, str(exception))
Failure = tuple[str, str, str]
# An output as the transform yielded it: (value, key, topic, headers)
WireOutput = tuple[object, object, object, object]
# One record's result: the outputs yielded before it ended, the failure that ended
# it (None: none), and the seconds the transform took.
WireResult = tuple[list[WireOutput], Failure | None, float]


def wire_record(msg: Message) -> WireRecord:
    """As ``service.kafka.messages.to_record`` sees the message, as a tuple."""
    raw: list[tuple[str, bytes | None]] | None = msg.headers()  # type: ignore[assignment]
    headers = tuple((name, value or b"") for name, value in raw) if raw else ()
    return (msg.topic(), msg.partition(), msg.offset(),  # type: ignore[return-value]
            msg.timestamp()[1], msg.key(), msg.value(), headers)


def failure_of(exc: BaseException) -> Failure:
    kind = type(exc)
    return kind.__module__, kind.__qualname__, str(exc)


@cache
def _kind(module: str, qualname: str) -> type[Exception]:
    """A stand-in class with the original's names: the dead letter names it alike."""
    return type(qualname.rpartition(".")[2], (Exception,),
                {"__module__": module, "__qualname__": qualname})


def rebuilt(failure: Failure) -> Exception:
    """The worker's exception as the main process can hold it: same class names, and
    the same ``str()`` (its message is the one argument)."""
    module, qualname, message = failure
    return _kind(module, qualname)(message)


class Replay(list[Output]):
    """What the transform yielded for a record in a worker, given to
    ``processing.process`` in its place: the outputs, then the failure that ended
    the transform (if any), raised where the transform raised it."""

    __slots__ = ("failure",)

    def __init__(self, outputs: list[Output], failure: Exception | None) -> None:
        super().__init__(outputs)
        self.failure = failure

    def __iter__(self) -> Iterator[Output]:
        yield from super().__iter__()
        if self.failure is not None:
            raise self.failure


def replay(result: WireResult) -> Replay:
    outputs, failure, _ = result
    return Replay([Output(*out) for out in outputs],  # type: ignore[arg-type]
                  None if failure is None else rebuilt(failure))
