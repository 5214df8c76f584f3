"""What the loop does with an error consume() hands it."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message

from service.errors import FatalError
from tests.unit.fakes import TOPIC, ScriptedConsumer, make_loop


def errored(error: KafkaError) -> Message:
    return Message(topic=TOPIC, partition=0, offset=-1, error=error)


def test_a_consumer_fatal_error_stops_the_replica_even_when_not_flagged_fatal() -> None:
    # KIP-848 static membership: a member whose instance id is still in use gets
    # UNRELEASED_INSTANCE_ID, which librdkafka hands over as code _FATAL with its
    # fatal flag unset; the consumer is dead, and the loop went on polling it forever.
    loop, _, _ = make_loop(ScriptedConsumer())
    error = KafkaError(KafkaError._FATAL, "Fatal error: Broker: The instance ID is still "
                       "used by another member in the consumer group")
    with pytest.raises(FatalError):
        loop.consume_error(error, errored(error))


def test_a_transient_consume_error_is_only_logged() -> None:
    loop, _, _ = make_loop(ScriptedConsumer())
    error = KafkaError(KafkaError._TRANSPORT, "connection refused")
    loop.consume_error(error, errored(error))
