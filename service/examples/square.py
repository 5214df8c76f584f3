"""The book's example: the input value is an integer, the output its square, same key.

Values are ASCII decimal integers (``b"7"`` becomes ``b"49"``), so they read well
in a console consumer. A value that is not an integer raises, and the record
goes to the dead-letter topic.
"""

from collections.abc import Iterator

from service.contract.records import Output, Record


def square(record: Record) -> Iterator[Output]:
    if record.value is None:
        raise ValueError("square: the value is null, expected an integer")
    number = int(record.value)
    yield Output(value=str(number * number).encode(), key=record.key)
