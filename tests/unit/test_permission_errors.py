"""Denials (authentication, missing ACLs) without a broker: KafkaError built directly.
A denial is never retried or aborted, whatever librdkafka's flags say, and its message
starts with the ACL the principal lacks."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from service.errors import DeniedError, Where, transactional_prefix
from service.kafka.errors import classify

PRODUCER = Where("commit_transaction", "orders.in.3", "in", 3, 41)


@pytest.mark.parametrize(("code", "where", "permission"), [
    (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, PRODUCER,
     "WRITE on transactional id prefix `orders.`"),
    (KafkaError.GROUP_AUTHORIZATION_FAILED, Where("consume"),
     "READ on the consumer group (TXSTAGE_GROUP_ID)"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, Where("consume"), "READ on an input topic"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, PRODUCER, "WRITE on an output or dead-letter topic"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, Where("consume", topic="in", partition=2),
     "READ on input topic `in`"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, Where("describe_configs", topic="out"),
     "DESCRIBE_CONFIGS on topic `out`"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, Where("create_topics", topic="progress"),
     "CREATE on topic `progress`"),
    (KafkaError.CLUSTER_AUTHORIZATION_FAILED, Where("describe_configs"),
     "DESCRIBE_CONFIGS on the cluster"),
    (KafkaError.SASL_AUTHENTICATION_FAILED, Where("list_topics"), "authentication failed"),
    (KafkaError._AUTHENTICATION, Where("list_topics"), "authentication failed"),
])
def test_a_denial_names_the_missing_permission(code: int, where: Where, permission: str) -> None:
    error = classify(KafkaError(code, "denied", txn_requires_abort=True, retriable=True))
    assert error is DeniedError
    denied = error(where, KafkaError(code, "denied"))
    assert str(denied).startswith(f"permission denied: {permission}")
    assert denied.action == "denied"


def test_a_topic_denial_of_a_transaction_tells_input_read_from_output_write() -> None:
    where = Where("send_offsets_to_transaction", "orders.in.3", "in", 3)
    offsets = DeniedError(where, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                            "Broker: Topic authorization failed"))
    outputs = DeniedError(where, KafkaError(
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        "Failed to add partition(s) to transaction on broker TxnCoordinator/0"))
    assert offsets.permission == "READ on input topic `in`"
    assert outputs.permission == "WRITE on an output or dead-letter topic"


def test_the_prefix_of_a_transactional_id_keeps_the_dots_of_the_prefix() -> None:
    assert transactional_prefix(Where("init", "orders.v2.in.b.7", "in.b", 7)) == "orders.v2."
    assert transactional_prefix(Where("init", "orders.v2.txstage-check")) == "orders.v2."
