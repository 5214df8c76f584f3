"""The one place a replica's guarantee is picked: the guarantee object, and the
traits of it that the state machine and the consumer must know."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, TopicPartition

from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage.guarantees.at_least_once import AtLeastOnce, CommitOffsets
from service.stage.guarantees.exactly_once import ExactlyOnce
from service.stage.guarantees.guarantee import Guarantee
from service.stage.guarantees.spanning import Spanning

OffsetsCommitted = Callable[[KafkaError | None, list[TopicPartition]], bool]


@dataclass(frozen=True, slots=True)
class Traits:
    """What differs beyond the Guarantee interface."""

    # Exactly-once: a new producer after every abort (its init_transactions bumps the
    # epoch and fences what the aborted transaction left in flight). At-least-once
    # shares one producer.
    renew_after_abort: bool
    # At-least-once: a commit only seals a delivery window; offsets follow delivery.
    commits_deferred: bool
    # At-least-once: the consumer's on_commit callback, told of offsets committed.
    offsets_committed: OffsetsCommitted | None


def for_settings(settings: Settings, metrics: Metrics, commit_offsets: CommitOffsets, *,
                 message_max_bytes: int | None = None) -> tuple[Guarantee, Traits]:
    """``TXSTAGE_GUARANTEE``'s guarantee; ``commit_offsets`` commits a consumer's offsets
    (at-least-once only); ``message_max_bytes``: its producers' (producer_config's)."""
    if settings.spanning:
        return (Spanning(settings, metrics, message_max_bytes=message_max_bytes),
                Traits(True, False, None))
    if settings.exactly_once:
        return (ExactlyOnce(settings, metrics, message_max_bytes=message_max_bytes),
                Traits(True, False, None))
    alo = AtLeastOnce(settings, metrics, commit_offsets, message_max_bytes=message_max_bytes)
    return alo, Traits(False, True, alo.offsets_committed)
