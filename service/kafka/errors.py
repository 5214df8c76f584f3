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

from service.errors import (
    AbortableError,
    FatalError,
    FencedError,
    KafkaOperationError,
    RetriableError,
    Where,
)
from service.kafka.delivery import REFUSALS


class DeniedError(FatalError):
    """The broker refused this principal; the message starts with what it lacks."""

    action = "denied"

    def __init__(self, where: Where, error: KafkaError) -> None:
        super().__init__(where, error)
        self.permission = missing_permission(self.code, where, error.str()) or error.name()
        self.args = (f"permission denied: {self.permission} ({self.args[0]})",)


# The broker refused the principal: no retry or abort can change that.
DENIALS = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION,
})
_AUTHENTICATION = frozenset({KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION})


def missing_permission(code: int, where: Where, message: str = "") -> str | None:
    """What the principal lacks, in ACL terms, for a denial ``code`` met doing ``where``
    (``None``: not a denial). READ and WRITE imply DESCRIBE, so those are named."""
    if code in _AUTHENTICATION:
        return ("authentication failed: check TXSTAGE_KAFKA__SASL_USERNAME, "
                "TXSTAGE_KAFKA__SASL_PASSWORD and TXSTAGE_KAFKA__SASL_MECHANISM")
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return f"WRITE on transactional id prefix `{transactional_prefix(where)}`"
    if where.op == "describe_configs" and code in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                                   KafkaError.CLUSTER_AUTHORIZATION_FAILED):
        return "DESCRIBE_CONFIGS on " + (f"topic `{where.topic}`" if where.topic else "the cluster")
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return "READ on the consumer group (TXSTAGE_GROUP_ID)"
    if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        return f"the cluster refused {where.op} (CLUSTER_AUTHORIZATION_FAILED)"
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return _topic_permission(where, message)
    return None


def _topic_permission(where: Where, message: str) -> str:
    """Which topic ACL: a transaction's offsets need READ on the input topic, its
    outputs WRITE (librdkafka reports both through send_offsets_to_transaction and
    commit_transaction; only its message tells an AddPartitionsToTxn failure apart)."""
    if where.op == "create_topics":
        return f"CREATE on topic `{where.topic}`"
    reads = where.op in ("consume", "seek", "committed") or (
        where.op == "send_offsets_to_transaction" and "add partition" not in message.lower())
    if not reads:
        return "WRITE on an output or dead-letter topic"
    return f"READ on input topic `{where.topic}`" if where.topic else "READ on an input topic"


def transactional_prefix(where: Where) -> str:
    """``<prefix>.`` of a ``<prefix>.<topic>.<partition>`` id, as the ACL names it."""
    txid = where.transactional_id or ""
    tail = f".{where.topic}.{where.partition}"
    if where.topic is not None and txid.endswith(tail):
        return txid[: -len(tail)] + "."
    return txid.rsplit(".", 1)[0] + "." if "." in txid else txid


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


@contextmanager
def translated(where: Where) -> Iterator[None]:
    """Run a librdkafka call; re-raise its KafkaException as a txstage error."""
    try:
        yield
    except KafkaException as exc:
        raise translate(exc, where) from exc
