"""What happens to a partition: the loop's observations and the results of the
calls that run beside it."""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import (
    Failure,
    KafkaOperationError,
    PoisonRecordError,
)
from service.stage.machine.phases import Overrun


@dataclass(frozen=True, slots=True)
class Wrote:
    """Records ``first``..``next - 1`` were written into the transaction (one batch)."""

    first: int
    next: int
    records: int
    now: float
    first_ts_ms: int = -1  # the batch's first and last record's timestamps
    last_ts_ms: int = -1


@dataclass(frozen=True, slots=True)
class InitDone:
    now: float


@dataclass(frozen=True, slots=True)
class InitFailed:
    error: BaseException
    now: float


@dataclass(frozen=True, slots=True)
class Positioned:
    """The offset committed in Kafka (read_committed: RequireStable); < 0 when none;
    and the overrun an earlier owner recorded for the partition, if any."""

    offset: int
    now: float
    overrun: Overrun | None = None


@dataclass(frozen=True, slots=True)
class PositionFailed:
    error: BaseException


@dataclass(frozen=True, slots=True)
class CommitDue:
    now: float
    # TXSTAGE_TRANSACTIONS=spanning: the replica's transaction commits for another
    # partition's sake; this one joins it, with nothing open if it has nothing.
    join: bool = False


@dataclass(frozen=True, slots=True)
class CommitDone:
    seconds: float
    now: float


@dataclass(frozen=True, slots=True)
class CommitFailed:
    error: KafkaOperationError
    failures: tuple[Failure, ...]
    now: float


@dataclass(frozen=True, slots=True)
class ProduceFailed:
    error: KafkaOperationError
    now: float


@dataclass(frozen=True, slots=True)
class DeliveryFailed:
    """At-least-once: outputs of this partition were not delivered. ``through``: the
    end of the failed outputs' records (a failure written unnamed is below it)."""

    failures: tuple[Failure, ...]
    now: float
    through: int | None = None


@dataclass(frozen=True, slots=True)
class AbortDone:
    failures: tuple[Failure, ...]
    now: float


@dataclass(frozen=True, slots=True)
class SpanAborted:
    """TXSTAGE_TRANSACTIONS=spanning: the replica's transaction is aborted for another
    partition; whatever this one had in it is gone, and it reads again from Kafka."""

    error: KafkaOperationError
    now: float


@dataclass(frozen=True, slots=True)
class AbortFailed:
    error: KafkaOperationError
    now: float


@dataclass(frozen=True, slots=True)
class Poisoned:
    """The transform failed on a record and there is no dead-letter topic."""

    error: PoisonRecordError
    now: float


@dataclass(frozen=True, slots=True)
class BacklogFull:
    """The partition holds as many records (or bytes) as it may: stop fetching it."""


@dataclass(frozen=True, slots=True)
class BacklogDrained:
    """Its held records fell below the limits while it is active: fetch it again."""


@dataclass(frozen=True, slots=True)
class TopicUnknown:
    """An output goes to a topic whose limits are not known yet: look them up."""

    topic: str


@dataclass(frozen=True, slots=True)
class TopicResolved:
    topic: str


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


@dataclass(frozen=True, slots=True)
class CallStuck:
    """The commit or abort running beside the loop has not returned long after its
    own deadline: librdkafka can miss a call's timeout (librdkafka#5456, #5511: a
    coordinator request that is never retried after a broker restart)."""

    now: float


@dataclass(frozen=True, slots=True)
class ReachedEnd:
    """Every record before ``at`` was processed and the fetcher reported the end of
    the partition at ``end`` > ``at``: the offsets between are commit markers or
    aborted records, never delivered. Committing ``end`` (not ``at``) lets the group's
    lag reach 0 on a transactional input."""

    at: int
    end: int
    now: float


@dataclass(frozen=True, slots=True)
class Released:
    """Revoked (``lost=False``), lost, or the replica stops (``reason``)."""

    lost: bool
    now: float
    reason: str = "revoked"
    deadline: float | None = None  # (monotonic) by when the release must be over


Event = (Wrote | InitDone | InitFailed | Positioned | PositionFailed | CommitDue | CommitDone
         | CommitFailed | ProduceFailed | DeliveryFailed | AbortDone | AbortFailed | Poisoned
         | BacklogFull | BacklogDrained | TopicUnknown | TopicResolved | Tick | CallStuck
         | ReachedEnd | Released | SpanAborted)
