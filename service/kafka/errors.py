"""The one place librdkafka's errors become txstage's (:mod:`service.errors`).

``translate`` classifies by librdkafka's own flags (``retriable()``,
``txn_requires_abort()``, ``fatal()``) and the ``_FENCED`` code, in that spirit:
fenced first (librdkafka marks it fatal too), then retriable, abortable, fatal.
Denials come before all of them: librdkafka marks a topic's authorization failure
abortable, and retrying it (abort, produce again) would loop for as long as the ACL
is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from service.error_codes import DENIALS, REFUSALS
from service.errors import (
    AbortableError,
    DeniedError,
    FatalError,
    FencedError,
    KafkaOperationError,
    RetriableError,
    UnfinishedError,
    Where,
)


def classify(error: KafkaError) -> type[KafkaOperationError]:
    """The txstage class for a librdkafka error, by librdkafka's own flags."""
    if error.code() in DENIALS:
        return DeniedError
    if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
        return FencedError
    if error.retriable():
        return RetriableError
    if error.txn_requires_abort():
        return AbortableError
    return FatalError


# The group moved on while offsets were sent (a rebalance; under KIP-848 a newer
# member epoch): those offsets must not commit, but only this partition's
# transaction is affected: abort it and resume from the committed offset.
_GROUP_MOVED_ON = frozenset({
    KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID,
    KafkaError.REBALANCE_IN_PROGRESS, KafkaError.STALE_MEMBER_EPOCH,
    KafkaError.FENCED_MEMBER_EPOCH,
})


def kafka_error(exc: KafkaException) -> KafkaError | None:
    """The KafkaError a KafkaException carries, if it carries one."""
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None


def translate(exc: KafkaException, where: Where) -> KafkaOperationError:
    """Turn a KafkaException into the txstage error that says what to do."""
    error = kafka_error(exc)
    if error is None:
        error = KafkaError(KafkaError._FAIL, str(exc), fatal=True)
    if where.op == "send_offsets_to_transaction" and error.code() in _GROUP_MOVED_ON:
        return AbortableError(where, error)
    if where.op == "produce" and error.code() in REFUSALS:
        # Refused by the producer itself (over its message.max.bytes, a topic it knows
        # is gone): the record's fault, not the producer's. Abortable, so the state
        # machine finds the record (``where.offset``) and dead-letters it.
        return AbortableError(where, error)
    return classify(error)(where, error)


def translate_error(error: KafkaError, where: Where) -> KafkaOperationError:
    """The txstage error for a KafkaError met outside an exception (a message's error)."""
    return translate(KafkaException(error), where)


@contextmanager
def translated(where: Where) -> Iterator[None]:
    """Run a librdkafka call; re-raise its KafkaException as a txstage error."""
    try:
        yield
    except KafkaException as exc:
        raise translate(exc, where) from exc


@contextmanager
def untranslated() -> Iterator[None]:
    """Run code that lets librdkafka's own error through (service.kafka.reading, what the
    operator tools read with): its KafkaException leaves as an UnfinishedError with the
    same message, for callers outside this boundary, which may not catch KafkaException."""
    try:
        yield
    except KafkaException as exc:
        raise UnfinishedError(str(exc)) from exc
