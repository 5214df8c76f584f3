"""txstage's exceptions; none imports Kafka (librdkafka's errors are translated into
them in one place, :mod:`service.kafka.errors`).

    TxstageError
    ├── ConfigError           bad settings or transform; the CLI exits 2
    ├── PoisonRecordError     a record the transform cannot turn into outputs
    ├── TopicLimitPending     an output topic's limits are being looked up: retry later
    └── KafkaOperationError   a librdkafka call failed; carries op, partition, code
        ├── RetriableError    retry the same call (a commit time-out is one: never abort)
        ├── AbortableError    abort the transaction, rewind to its first offset
        ├── FencedError       another owner took the transactional.id: drop the producer
        └── FatalError        nothing to retry; the replica exits non-zero
            └── DeniedError   authentication failed or an ACL is missing: never retried,
                              never aborted; the message names the permission
                              (in service/kafka/errors.py: it reads Kafka's codes)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from service.contract.records import Output


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


class PoisonRecordError(TxstageError):
    """The transform raised, or an output cannot be produced (e.g. too large)."""

    def __init__(self, topic: str, partition: int, offset: int, cause: BaseException) -> None:
        self.topic, self.partition, self.offset, self.cause = topic, partition, offset, cause
        super().__init__(
            f"poison record {topic}/{partition}@{offset}: {type(cause).__name__}: {cause}"
        )


class TopicLimitPending(TxstageError):
    """An output goes to a topic whose size limit is not known yet. The stage looks
    it up beside the loop and processes the record again afterwards, from
    ``outputs`` (what the transform yielded for it, set by ``processing.process``)
    rather than calling the transform a second time."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.outputs: list[Output] | None = None
        super().__init__(f"the limits of topic {topic!r} are being looked up")


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


class FencedError(KafkaOperationError):
    action = "fenced"


class FatalError(KafkaOperationError):
    action = "fatal"


