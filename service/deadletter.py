"""Dead-letter records: the original record plus why and where it failed.

Written in the same transaction as the input offset that skips it, so a poison
record is either dead-lettered exactly once or not consumed at all.
"""

from __future__ import annotations

from service.records import Output, Record

ERROR_CLASS = "txstage.error.class"
ERROR_MESSAGE = "txstage.error.message"
ERROR_TOPIC = "txstage.error.topic"
ERROR_PARTITION = "txstage.error.partition"
ERROR_OFFSET = "txstage.error.offset"

_MAX_MESSAGE = 4096


def dead_letter(record: Record, error: BaseException, topic: str) -> Output:
    """The dead-letter output for ``record`` that failed with ``error``."""
    message = str(error)[:_MAX_MESSAGE]
    headers = (
        *record.headers,
        (ERROR_CLASS, type(error).__qualname__.encode()),
        (ERROR_MESSAGE, message.encode("utf-8", "replace")),
        (ERROR_TOPIC, record.topic.encode()),
        (ERROR_PARTITION, str(record.partition).encode()),
        (ERROR_OFFSET, str(record.offset).encode()),
    )
    return Output(value=record.value, key=record.key, topic=topic, headers=headers)
