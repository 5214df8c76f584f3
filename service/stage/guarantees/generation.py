"""The parts of a spanning transaction (guarantees/spanning.py): a generation of the
replica's shared producer, a commit round, and the replica's transactional id."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

import structlog
from confluent_kafka import KafkaError

from service.errors import Failure, KafkaOperationError, SharedAbortError, Where
from service.kafka.producer import close_quietly
from service.kafka.spanning_producer import SpanningProducer
from service.settings import Settings
from service.stage.partition import TopicPartitionKey

log = structlog.get_logger(__name__)


@dataclass(eq=False)
class Round:
    """One commit of a generation's transaction."""

    group_metadata: object
    offsets: dict[TopicPartitionKey, int] = field(default_factory=dict)
    sealed: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    members: set[TopicPartitionKey] = field(default_factory=set)  # every joiner
    ran: bool = False
    seconds: float = 0.0
    error: KafkaOperationError | None = None
    # Each member's failed outputs, when it failed: the error is only theirs to act on
    failures: dict[TopicPartitionKey, tuple[Failure, ...]] = field(default_factory=dict)


@dataclass(eq=False)
class Generation:
    """One shared producer, from its init until an abort or a fence ends it."""

    ready: threading.Event = field(default_factory=threading.Event)
    producer: SpanningProducer | None = None
    failed: KafkaOperationError | None = None
    members: set[TopicPartitionKey] = field(default_factory=set)
    ended: bool = False            # aborted, fenced or given up: no new transaction
    in_flight: Round | None = None  # the sealed round not yet done
    aborted: threading.Event = field(default_factory=threading.Event)  # its abort ran
    abort_lock: threading.Lock = field(default_factory=threading.Lock)
    abort_error: KafkaOperationError | None = None
    abort_ran: bool = False
    closing: bool = False          # handed to a job to close: the last member left


_PROCESS = uuid.uuid4().hex[:12]  # this process's own


def transactional_id(settings: Settings) -> str:
    """The replica's one id: ``<prefix>.replica.<group.instance.id>`` with static
    membership (a restarted replica fences its predecessor at once), else
    ``<prefix>.replica.<a random id of this process>`` (a crashed replica's open
    transaction ends at the transaction time-out). A zombie is fenced by the group
    (KIP-447): its offsets carry a generation that has passed."""
    instance = settings.consumer.get("group.instance.id") or \
        settings.kafka.get("group.instance.id")
    return f"{settings.id_prefix}.replica.{instance.get_secret_value() if instance else _PROCESS}"


def shared_abort(op: str, tid: str, why: str) -> SharedAbortError:
    return SharedAbortError(Where(op, tid), KafkaError(KafkaError._STATE, why))


def close_gen(gen: Generation | None) -> None:
    """Close a generation's producer (librdkafka aborts what is open): then the next
    generation's init_transactions may go ahead."""
    if gen is None:
        return
    try:
        close_quietly(gen.producer)
    finally:
        gen.aborted.set()
