"""PinnedProducer's translation of librdkafka states that hide their cause, without
a broker: the confluent-kafka Producer is replaced by an autospec'd fake."""

from __future__ import annotations

from unittest.mock import create_autospec, patch

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from service.contract.processing import Produced
from service.contract.records import Record
from service.errors import AbortableError, FatalError, FencedError, RetriableError
from service.kafka import transaction
from service.kafka.producer import PinnedProducer

OUT = Produced("out", b"k", b"v", [])


def pinned(*, connect_first: bool = False) -> tuple[PinnedProducer, Producer]:
    fake = create_autospec(Producer, instance=True)
    with patch("service.kafka.producer.Producer", return_value=fake):
        producer = PinnedProducer({"transactional.id": "g.in.0"}, "in", 0, deadline_s=0.2,
                                  connect_first=connect_first)
    return producer, fake


def test_init_connects_before_asking_for_a_transactional_pid() -> None:
    # Asked before any connection is up, the PID waits for librdkafka's 500 ms timer.
    producer, fake = pinned(connect_first=True)
    fake.list_topics.side_effect = KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))
    producer.init()  # a failed warm-up is init_transactions' to report, if it persists
    assert [c[0] for c in fake.mock_calls[:2]] == ["list_topics", "init_transactions"]
    assert fake.list_topics.call_args.args == ("in",)
    producer, fake = pinned(connect_first=True)  # the second waits for a connected broker
    producer.init()
    assert [c[0] for c in fake.mock_calls[:3]] == ["list_topics", "list_topics",
                                                   "init_transactions"]
    stage_producer, fake = pinned()  # a replacement's: see PinnedProducer.init
    stage_producer.init()
    fake.list_topics.assert_not_called()


def test_produce_in_an_abortable_transaction_is_abortable() -> None:
    producer, fake = pinned()
    fake.produce.side_effect = KafkaException(KafkaError(KafkaError._STATE, "Erroneous state"))
    with pytest.raises(AbortableError):
        producer.produce(OUT, 7)


def test_bare_fatal_is_resolved_to_the_fence_reported_by_poll() -> None:
    producer, fake = pinned()
    fake.produce.side_effect = KafkaException(KafkaError(KafkaError._FATAL, "Fatal error"))
    fake.poll.side_effect = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    with pytest.raises(FencedError) as caught:
        producer.produce(OUT, 7)
    assert "in/0@7" in str(caught.value)


def test_bare_fatal_is_resolved_to_the_cause_error_cb_recorded() -> None:
    producer, fake = pinned()
    producer._record_error(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    fake.begin_transaction.side_effect = KafkaException(KafkaError(KafkaError._FATAL, "Fatal"))
    with pytest.raises(FencedError):
        producer.begin()
    fake.poll.assert_not_called()


def test_a_fence_served_by_another_threads_poll_is_still_named_by_the_next_call() -> None:
    # The loop polls every pinned producer: the one poll that serves the fatal event
    # must keep its cause, or the next produce sees a bare _FATAL and the replica exits.
    producer, fake = pinned()
    served = [KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))]

    def poll(timeout: float) -> int:
        if served:
            raise served.pop()
        return 0
    fake.poll.side_effect = poll
    producer.poll()
    fake.produce.side_effect = KafkaException(KafkaError(KafkaError._FATAL, "Fatal"))
    with pytest.raises(FencedError):
        producer.produce(OUT, 7)


def test_a_bare_fatal_waits_for_its_cause_to_be_queued() -> None:
    # librdkafka sets the fatal error before it queues the event naming it.
    producer, fake = pinned()
    polls = iter([0, 0, KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))])

    def poll(timeout: float) -> int:
        answer = next(polls, 0)
        if isinstance(answer, KafkaException):
            raise answer
        return answer
    fake.poll.side_effect = poll
    fake.produce.side_effect = KafkaException(KafkaError(KafkaError._FATAL, "Fatal"))
    with pytest.raises(FencedError):
        producer.produce(OUT, 7)


def test_fatal_without_a_known_cause_stays_fatal() -> None:
    producer, fake = pinned()
    fake.produce.side_effect = KafkaException(KafkaError(KafkaError._FATAL, "Fatal"))
    with pytest.raises(FatalError):
        producer.produce(OUT, 7)


def test_commit_time_out_is_retried_never_aborted() -> None:
    producer, fake = pinned()
    timeout = KafkaException(KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True))
    fake.commit_transaction.side_effect = [timeout, timeout, None]
    producer.commit()
    assert fake.commit_transaction.call_count == 3
    fake.abort_transaction.assert_not_called()


def test_commit_still_timing_out_after_the_deadline_raises_retriable() -> None:
    producer, fake = pinned()
    fake.commit_transaction.side_effect = KafkaException(
        KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True))
    with pytest.raises(RetriableError):
        producer.commit()
    fake.abort_transaction.assert_not_called()


def test_send_offsets_is_retried_with_identical_offsets() -> None:
    producer, fake = pinned()
    fake.send_offsets_to_transaction.side_effect = [
        KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "x", retriable=True)),
        None]
    producer.send_offsets(42, "metadata")
    first, second = fake.send_offsets_to_transaction.call_args_list
    assert first.args[:2] == second.args[:2]  # the same offsets and group metadata
    offsets, _metadata, timeout = first.args
    assert [(tp.topic, tp.partition, tp.offset) for tp in offsets] == [("in", 0, 42)]
    assert 0 < second.args[2] <= timeout <= producer.deadline_s


def test_every_transactional_call_is_given_the_time_left_never_forever() -> None:
    """librdkafka's transactional calls block forever without a timeout (and its
    background operation retries as long as the first call allows)."""
    producer, fake = pinned()
    producer.init()
    producer.begin()
    producer.send_offsets(1, "metadata")
    producer.commit()
    producer.begin()
    producer.abort()
    for call in (fake.init_transactions, fake.send_offsets_to_transaction,
                 fake.commit_transaction, fake.abort_transaction):
        timeout = call.call_args.args[-1]
        assert isinstance(timeout, float) and 0 < timeout <= producer.deadline_s


def test_failed_commit_keeps_its_own_class_and_keeps_the_failed_output() -> None:
    # The delivery report of a refused record has no transaction flags; the commit's
    # error has them and must decide (abort), not the report (which looks fatal).
    # The report stays available: it names the real cause and the record.
    producer, fake = pinned()
    producer.deliveries(KafkaError(KafkaError.INVALID_RECORD, "refused"),
                        None)  # type: ignore[arg-type]  # the callback only records
    producer.deliveries(KafkaError(KafkaError._PURGE_QUEUE, "purged"),
                        None)  # type: ignore[arg-type]  # a consequence, never the cause
    fake.commit_transaction.side_effect = KafkaException(
        KafkaError(KafkaError.INVALID_RECORD, "must abort", txn_requires_abort=True))
    with pytest.raises(AbortableError):
        transaction.commit(producer, 10, lambda: "metadata")
    [failure] = producer.take_failures()
    assert failure.refusal and failure.name == "INVALID_RECORD"


def test_a_new_transaction_forgets_failures_of_the_last_one() -> None:
    producer, _ = pinned()
    producer.deliveries(KafkaError(KafkaError.INVALID_RECORD, "old"), None)  # type: ignore[arg-type]
    producer.begin()
    assert producer.deliveries.take() == ()


def test_a_run_is_written_unnamed_and_a_failure_names_its_record() -> None:
    producer, fake = pinned()
    fake.produce.side_effect = [None, None, KafkaException(
        KafkaError(KafkaError._STATE, "Erroneous state"))]
    run = [(Record("in", 0, offset, 0, None, b""), [OUT]) for offset in (7, 8, 9)]
    with pytest.raises(AbortableError) as caught:
        producer.produce_run(run)
    assert caught.value.where.offset == 9 and "in/0@9" in str(caught.value)
    assert fake.produce.call_count == 3
    assert all("on_delivery" not in call.kwargs for call in fake.produce.call_args_list)
