"""What goes wrong with a formatted record: the record's fault (a dead letter), or the
registry's (the partition waits, and goes on by itself)."""

from __future__ import annotations

from collections.abc import Callable

from service.contract.processing import TopicLimitPending


class UndecodableError(ValueError):
    """Bytes not in the registry wire format, an unknown schema id, or a payload that
    does not decode with its schema: the record is dead-lettered with this cause."""


class OutputSchemaError(ValueError):
    """An output does not match its schema: the input is dead-lettered."""


class RegistryUnavailable(TopicLimitPending):
    """The registry did not answer (unreachable, 5xx, time-out): the partition holds its
    records while ``lookup`` asks again beside the loop, then processes them again. The
    record is not at fault: never a dead letter, never a skip."""

    def __init__(self, what: str, lookup: Callable[[], object], cause: BaseException) -> None:
        super().__init__(f"schema registry: {what}")
        self.lookup = lookup
        self.args = (f"the schema registry did not answer for {what}: "
                     f"{type(cause).__name__}: {cause}",)


class RegistryError(RuntimeError):
    """The registry refused a lookup at start-up or in a tool (it was down past the
    deadline, or answered with an error that is not the record's)."""
