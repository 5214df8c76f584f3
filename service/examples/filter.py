"""A filter: keeps records whose integer value is even; the others produce nothing.

Zero outputs still advance the input offset inside the transaction.
"""

from collections.abc import Iterator

from service.contract.records import Output, Record


def evens(record: Record) -> Iterator[Output]:
    if record.value is not None and int(record.value) % 2 == 0:
        yield Output(value=record.value, key=record.key)
