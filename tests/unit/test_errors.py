"""Error classification without a broker: KafkaError built directly, as librdkafka would."""

import pytest
from confluent_kafka import KafkaError, KafkaException

from service.errors import AbortableError, FatalError, FencedError, RetriableError, Where
from service.kafka.errors import classify, translate, translated

WHERE = Where("commit_transaction", "grp.in.3", "in", 3, 41)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True), RetriableError),
        (KafkaError(KafkaError._MSG_TIMED_OUT, "delivery", txn_requires_abort=True),
         AbortableError),
        (KafkaError(KafkaError._FENCED, "fenced", fatal=True), FencedError),
        (KafkaError(KafkaError.PRODUCER_FENCED, "fenced"), FencedError),
        (KafkaError(KafkaError._FATAL, "idempotence broken", fatal=True), FatalError),
        (KafkaError(KafkaError._FAIL, "no flag at all"), FatalError),
    ],
)
def test_librdkafka_flags_decide_the_class(error: KafkaError, expected: type) -> None:
    assert classify(error) is expected


def test_fenced_wins_over_its_fatal_flag() -> None:
    assert classify(KafkaError(KafkaError._FENCED, "x", fatal=True, retriable=True)) is FencedError


def test_translated_error_names_operation_partition_and_code() -> None:
    exc = translate(KafkaException(KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True)),
                    WHERE)
    assert isinstance(exc, RetriableError)
    text = str(exc)
    assert "commit_transaction" in text and "in/3@41" in text and "grp.in.3" in text
    assert "_TIMED_OUT" in text and str(KafkaError._TIMED_OUT) in text


def test_translated_context_manager_chains_the_original() -> None:
    original = KafkaException(KafkaError(KafkaError._STATE, "bad state", txn_requires_abort=True))
    with pytest.raises(AbortableError) as caught, translated(WHERE):
        raise original
    assert caught.value.__cause__ is original
