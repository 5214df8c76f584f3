"""Denials (authentication, missing ACLs) without a broker: KafkaError built directly.
A denial is never retried or aborted, whatever librdkafka's flags say, and its message
starts with the ACL the principal lacks."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from service.errors import DeniedError, Where, classify, transactional_prefix

PRODUCER = Where("commit_transaction", "orders.in.3", "in", 3, 41)


@pytest.mark.parametrize(("code", "where", "permission"), [
    (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, PRODUCER,
     "WRITE on transactional id prefix `orders.`"),
    (KafkaError.GROUP_AUTHORIZATION_FAILED, Where("consume"),
     "READ on the consumer group (TXSTAGE_GROUP_ID)"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, Where("consume"), "READ on an input topic"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, PRODUCER, "WRITE on an output or dead-letter topic"),
    (KafkaError.SASL_AUTHENTICATION_FAILED, Where("list_topics"), "authentication failed"),
    (KafkaError._AUTHENTICATION, Where("list_topics"), "authentication failed"),
])
def test_a_denial_names_the_missing_permission(code: int, where: Where, permission: str) -> None:
    error = classify(KafkaError(code, "denied", txn_requires_abort=True, retriable=True))
    assert error is DeniedError
    denied = error(where, KafkaError(code, "denied"))
    assert str(denied).startswith(f"permission denied: {permission}")
    assert denied.action == "denied"


def test_the_prefix_of_a_transactional_id_keeps_the_dots_of_the_prefix() -> None:
    assert transactional_prefix(Where("init", "orders.v2.in.b.7", "in.b", 7)) == "orders.v2."
    assert transactional_prefix(Where("init", "orders.v2.txstage-check")) == "orders.v2."
