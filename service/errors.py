"""txstage's exceptions; none imports Kafka (librdkafka's errors are translated into
them in one place, :mod:`service.kafka.errors`).

    TxstageError
    ├── ConfigError           bad settings or transform; the CLI exits 2
    ├── UnreachableError      the cluster did not answer at start-up; the CLI exits 4
    ├── PoisonRecordError     a record the transform cannot turn into outputs
    ├── TopicLimitPending     an output topic's limits are being looked up: retry later
    │                         (service.contract.processing: it carries the outputs)
    └── KafkaOperationError   a librdkafka call failed; carries op, partition, code
        ├── RetriableError    retry the same call (a commit time-out is one: never abort)
        ├── AbortableError    abort the transaction, rewind to its first offset
        ├── FencedError       another owner took the transactional.id: drop the producer
        └── FatalError        nothing to retry; the replica exits non-zero
            └── DeniedError   authentication failed or an ACL is missing: never retried,
                              never aborted; the message names the permission
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from service import error_codes as codes


class KafkaErrorLike(Protocol):
    """What an error needs of librdkafka's KafkaError (no confluent_kafka import here)."""

    def code(self) -> int: ...
    def name(self) -> str: ...
    def str(self) -> str: ...


class TxstageError(Exception):
    """Base of every error txstage raises on purpose."""


class ConfigError(TxstageError):
    """A setting, topic or transform is unusable; the CLI exits with code 2."""

    def __init__(self, *problems: str) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class UnreachableError(TxstageError):
    """The cluster did not answer the start-up checks while they waited for it. Not a
    ConfigError: the address may be right and the brokers down (or the other way round),
    and no setting can be named as wrong."""


class UnfinishedError(TxstageError):
    """A read or a call of an operator tool that the cluster did not let finish
    (librdkafka's own error, with its message): the tool exits 4, "could not finish"."""


class PoisonRecordError(TxstageError):
    """The transform raised, or an output cannot be produced (e.g. too large)."""

    def __init__(self, topic: str, partition: int, offset: int, cause: BaseException) -> None:
        self.topic, self.partition, self.offset, self.cause = topic, partition, offset, cause
        super().__init__(
            f"poison record {topic}/{partition}@{offset}: {type(cause).__name__}: {cause}"
        )


@dataclass(frozen=True, slots=True)
class Where:
    """What was being done, and to which input partition, when Kafka failed."""

    op: str
    transactional_id: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        parts = [self.op]
        if self.topic is not None:
            at = f"{self.topic}/{self.partition}"
            parts.append(at if self.offset is None else f"{at}@{self.offset}")
        if self.transactional_id is not None:
            parts.append(f"transactional.id={self.transactional_id}")
        return " ".join(parts)


class KafkaOperationError(TxstageError):
    """A librdkafka call failed; the subclass says what to do about it."""

    action = "fail"

    def __init__(self, where: Where, error: KafkaErrorLike) -> None:
        self.where, self.error = where, error
        self.code: int = error.code()
        super().__init__(
            f"{where}: {error.name()} ({self.code}): {error.str()} [{self.action}]"
        )


class RetriableError(KafkaOperationError):
    action = "retry"


class AbortableError(KafkaOperationError):
    action = "abort"


class SharedAbortError(AbortableError):
    """TXSTAGE_TRANSACTIONS=spanning: the replica's one transaction was aborted for
    another partition's sake, so this partition's part of it is gone too."""


class FencedError(KafkaOperationError):
    action = "fenced"


class FatalError(KafkaOperationError):
    action = "fatal"


class DeniedError(FatalError):
    """The broker refused this principal; the message starts with what it lacks."""

    action = "denied"

    def __init__(self, where: Where, error: KafkaErrorLike) -> None:
        super().__init__(where, error)
        self.permission = missing_permission(self.code, where, error.str()) or error.name()
        self.args = (f"permission denied: {self.permission} ({self.args[0]})",)


def missing_permission(code: int, where: Where, message: str = "") -> str | None:
    """What the principal lacks, in ACL terms, for a denial ``code`` met doing ``where``
    (``None``: not a denial). READ and WRITE imply DESCRIBE, so those are named."""
    if code in codes.AUTHENTICATION:
        return ("authentication failed: check TXSTAGE_KAFKA__SASL_USERNAME, "
                "TXSTAGE_KAFKA__SASL_PASSWORD and TXSTAGE_KAFKA__SASL_MECHANISM")
    if code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return f"WRITE on transactional id prefix `{transactional_prefix(where)}`"
    if where.op == "describe_configs" and code in (codes.TOPIC_AUTHORIZATION_FAILED,
                                                   codes.CLUSTER_AUTHORIZATION_FAILED):
        return "DESCRIBE_CONFIGS on " + (f"topic `{where.topic}`" if where.topic else "the cluster")
    if code == codes.GROUP_AUTHORIZATION_FAILED:
        return "READ on the consumer group (TXSTAGE_GROUP_ID)"
    if code == codes.CLUSTER_AUTHORIZATION_FAILED:
        return f"the cluster refused {where.op} (CLUSTER_AUTHORIZATION_FAILED)"
    if code == codes.TOPIC_AUTHORIZATION_FAILED:
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


@dataclass(frozen=True, slots=True)
class Failure:
    """One output that was not delivered."""

    code: int
    name: str
    message: str
    offset: int | None  # the input offset its lineage names, when it names one

    @property
    def refusal(self) -> bool:
        return self.code in codes.REFUSALS

    def error(self) -> CodedError:
        return CodedError(self.code, self.name, self.message)


@dataclass(frozen=True, slots=True)
class CodedError:
    """An error known by its code (a delivery report's): what KafkaOperationError needs."""

    code_: int
    name_: str
    message: str

    def code(self) -> int:
        return self.code_

    def name(self) -> str:
        return self.name_

    def str(self) -> str:
        return self.message
