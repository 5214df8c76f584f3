"""Dead-letter records: the original record plus why and where it failed.

Written in the same transaction as the input offset that skips it, so a poison
record is either dead-lettered exactly once or not consumed at all.

A letter is built to fit its topic: when the original record and the error headers
exceed the bytes the dead-letter topic takes, the original's value is left out, then
its key, then its headers, then the error message is cut, and ``txstage.error.dropped``
names what was left out with its size (``value=1048000,key=12``). So no record's bytes
can keep a letter from being written; the letter still names the input, the error
and the sizes.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.contract.records import Headers, Output, Record

ERROR_CLASS = "txstage.error.class"
ERROR_MESSAGE = "txstage.error.message"
ERROR_TOPIC = "txstage.error.topic"
ERROR_PARTITION = "txstage.error.partition"
ERROR_OFFSET = "txstage.error.offset"
# Only on a letter that had to be cut to fit: what was left out, ``part=bytes,...``.
DROPPED = "txstage.error.dropped"

_MAX_MESSAGE = 4096


def dead_letter(record: Record, error: BaseException, topic: str,
                room: int | None = None) -> Output:
    """The dead-letter output for ``record`` that failed with ``error``; ``room``: the
    bytes its key, value and headers may take together (None: no limit)."""
    message = str(error)[:_MAX_MESSAGE].encode("utf-8", "replace")
    letter = _letter(record.key, record.value, record.headers, record, error, message, topic)
    if room is None or size(letter) <= room:
        return letter
    return _fitted(record, error, message, topic, room)


def _letter(key: bytes | None, value: bytes | None, original: Headers, record: Record,
            error: BaseException, message: bytes, topic: str,
            dropped: str | None = None) -> Output:
    headers = (
        *original,
        (ERROR_CLASS, type(error).__qualname__.encode()),
        (ERROR_MESSAGE, message),
        (ERROR_TOPIC, record.topic.encode()),
        (ERROR_PARTITION, str(record.partition).encode()),
        (ERROR_OFFSET, str(record.offset).encode()),
    )
    if dropped is not None:
        headers = (*headers, (DROPPED, dropped.encode()))
    return Output(value=value, key=key, topic=topic, headers=headers)


def _fitted(record: Record, error: BaseException, message: bytes, topic: str,
            room: int) -> Output:
    """Leave out the value, then the key, then the original headers, until it fits;
    past that, cut the error message."""
    key, value, original = record.key, record.value, record.headers
    dropped: list[str] = []
    for part in ("value", "key", "headers"):
        if part == "value" and value is not None:
            dropped.append(f"value={len(value)}")
            value = None
        elif part == "key" and key is not None:
            dropped.append(f"key={len(key)}")
            key = None
        elif part == "headers" and original:
            dropped.append(f"headers={headers_size(original)}")
            original = ()
        else:
            continue
        letter = _letter(key, value, original, record, error, message, topic, ",".join(dropped))
        if size(letter) <= room:
            return letter
    final = ",".join([*dropped, f"message={len(message)}"])
    letter = _letter(key, value, original, record, error, message, topic, final)
    cut = message[:max(len(message) - (size(letter) - room), 0)]
    return _letter(key, value, original, record, error, cut, topic, final)


def dropped_parts(headers: Iterable[tuple[str, bytes | None]] | None) -> frozenset[str]:
    """What a letter left out to fit (``value``, ``key``, ``headers``, ``message``)."""
    for name, data in headers or ():
        if name == DROPPED and data:
            return frozenset(item.split("=", 1)[0] for item in data.decode().split(","))
    return frozenset()


def headers_size(headers: Headers) -> int:
    return sum(len(name) + len(data) for name, data in headers)


def size(out: Output) -> int:
    """An output's key, value and headers, in bytes."""
    return len(out.key or b"") + len(out.value or b"") + headers_size(out.headers)
