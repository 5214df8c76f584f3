"""The stage's decisions per error class, without a broker: the consumer and the
pinned producers are autospec'd fakes; errors are built as librdkafka builds them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from unittest.mock import MagicMock, create_autospec, patch

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from prometheus_client import CollectorRegistry

from service.errors import AbortableError, FencedError, RetriableError, Where
from service.health import Health
from service.metrics import Metrics
from service.pool import ProducerPool
from service.producer import PinnedProducer
from service.settings import load_settings
from service.stage import Stage

SETTINGS = load_settings({
    "TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TXSTAGE_GROUP_ID": "g",
    "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
    "TXSTAGE_TRANSFORM": "service.examples.square:square",
})
WHERE = Where("commit_transaction", "g.in.0", "in", 0)


def error(cls: type, code: int, **flags: bool) -> Exception:
    return cls(WHERE, KafkaError(code, "injected", **flags))  # type: ignore[no-any-return]


@pytest.fixture
def stage() -> Iterator[Stage]:
    def fake_producer(config: object, topic: str, partition: int, **kwargs: object) -> MagicMock:
        fake = create_autospec(PinnedProducer, instance=True)
        fake.transactional_id = f"g.{topic}.{partition}"
        fake.deliveries = MagicMock()
        fake.deliveries.take.return_value = None
        return fake

    metrics = Metrics(CollectorRegistry())
    with patch("service.stage.Consumer", autospec=True), \
            patch("service.pool.PinnedProducer", side_effect=fake_producer):
        pool = ProducerPool(SETTINGS, metrics, workers=2)
        stage = Stage(SETTINGS, lambda r: [], metrics, Health(), lambda t: 1 << 20, pool)
        stage.consumer.get_watermark_offsets.return_value = (0, 100)  # type: ignore[attr-defined]
        stage._on_assign(stage.consumer, [TopicPartition("in", 0)])
        yield stage
        pool.shutdown()


def open_transaction(stage: Stage, first: int = 10, last: int = 14) -> MagicMock:
    task = stage.pool.get(("in", 0))
    assert task is not None
    for offset in range(first, last + 1):
        task.write(offset, [])
    return task.producer  # type: ignore[return-value]


def commit(stage: Stage) -> None:
    """Start every due commit on the pool, then take their outcomes."""
    stage._commit_due(float("inf"))
    stage._collect_commits(wait=True)


def aborted(stage: Stage, reason: str) -> float:
    return stage.metrics.aborted.labels(reason=reason)._value.get()  # type: ignore[no-any-return]


def test_assignment_inits_the_producer_before_assigning(stage: Stage) -> None:
    producer = stage.pool.get(("in", 0)).producer  # type: ignore[union-attr]
    producer.init.assert_called_once()
    consumer: MagicMock = stage.consumer  # type: ignore[assignment]
    consumer.incremental_assign.assert_called_once()


def test_abortable_commit_aborts_and_rewinds_to_the_first_offset(stage: Stage) -> None:
    producer = open_transaction(stage)
    producer.commit.side_effect = error(AbortableError, KafkaError.INVALID_RECORD,
                                        txn_requires_abort=True)
    commit(stage)
    producer.abort.assert_called_once()
    consumer: MagicMock = stage.consumer  # type: ignore[assignment]
    (tp,), _ = consumer.seek.call_args
    assert (tp.topic, tp.partition, tp.offset) == ("in", 0, 10)
    assert aborted(stage, "abortable_error") == 1


def test_committed_offset_is_last_processed_plus_one(stage: Stage) -> None:
    producer = open_transaction(stage, 10, 14)
    commit(stage)
    (offset, _), _ = producer.send_offsets.call_args
    assert offset == 15
    assert stage.metrics.committed._value.get() == 1


def test_fenced_commit_closes_the_producer_and_pauses_until_ownership_is_sure(
        stage: Stage) -> None:
    producer = open_transaction(stage)
    producer.commit.side_effect = error(FencedError, KafkaError._FENCED, fatal=True)
    commit(stage)
    producer.close.assert_called_once()
    producer.abort.assert_not_called()
    consumer: MagicMock = stage.consumer  # type: ignore[assignment]
    consumer.pause.assert_called_once()
    stage._housekeeping()  # well within the session time-out: no new producer yet
    assert stage.pool.get(("in", 0)).producer is producer  # type: ignore[union-attr]
    stage.pool.get(("in", 0)).fenced_at = 0.0  # type: ignore[union-attr]  # long ago
    stage._housekeeping()
    reclaimed = stage.pool.get(("in", 0))
    assert reclaimed is not None and reclaimed.producer is not producer
    (tp,), _ = consumer.seek.call_args
    assert tp.offset == 10  # resumes where the lost transaction began
    assert aborted(stage, "fenced") == 1


def test_commit_time_out_past_its_deadline_is_never_aborted(stage: Stage) -> None:
    producer = open_transaction(stage)
    producer.commit.side_effect = error(RetriableError, KafkaError._TIMED_OUT, retriable=True)
    with pytest.raises(RetriableError):
        commit(stage)
    stage._close_dirty()
    producer.abort.assert_not_called()


def test_revoke_commits_a_healthy_transaction(stage: Stage) -> None:
    producer = open_transaction(stage)
    stage._on_revoke(stage.consumer, [TopicPartition("in", 0)])
    producer.commit.assert_called_once()
    producer.abort.assert_not_called()
    producer.close.assert_called_once()
    assert stage.pool.get(("in", 0)) is None


def test_lost_partition_is_aborted_never_committed(stage: Stage) -> None:
    producer = open_transaction(stage)
    stage._on_lost(stage.consumer, [TopicPartition("in", 0)])
    producer.commit.assert_not_called()
    producer.abort.assert_called_once()
    assert aborted(stage, "lost") == 1


def test_repeated_aborts_back_off_then_fail(stage: Stage) -> None:
    producer = open_transaction(stage)
    producer.commit.side_effect = error(AbortableError, KafkaError.INVALID_RECORD,
                                        txn_requires_abort=True)
    consumer: MagicMock = stage.consumer  # type: ignore[assignment]
    with pytest.raises(AbortableError) as caught:
        for _ in range(20):
            open_transaction(stage)
            commit(stage)
    assert producer.abort.call_count == 10
    assert "in/0: 10 aborts in a row; the last covered input offsets 10..14" in \
        caught.value.__notes__
    assert consumer.pause.called  # backoff between attempts


def test_callback_errors_are_raised_on_the_loop_thread(stage: Stage) -> None:
    stage._on_client_error(KafkaError(KafkaError._FATAL, "broken", fatal=True))  # no raise here
    consumer: MagicMock = stage.consumer  # type: ignore[assignment]
    consumer.consume.return_value = []
    with pytest.raises(Exception, match="broken"):
        stage.iterate()


def test_consumer_is_never_left_reading_uncommitted() -> None:
    with patch("service.stage.Consumer", autospec=True) as consumer_class:
        Stage(SETTINGS, lambda r: [], Metrics(CollectorRegistry()), Health(), lambda t: 1,
              create_autospec(ProducerPool, instance=True))
    (config,), _ = consumer_class.call_args
    assert config["isolation.level"] == "read_committed"
    assert config["enable.auto.commit"] is False
    assert isinstance(Consumer, type)


def test_records_arriving_during_a_commit_wait_in_order_then_join_the_next_transaction(
        stage: Stage) -> None:
    producer = open_transaction(stage, 10, 14)
    started = threading.Event()
    release = threading.Event()

    def slow_commit() -> None:
        started.set()
        release.wait(5)

    producer.commit.side_effect = slow_commit
    stage._commit_due(float("inf"))
    assert started.wait(5)
    arrived = [fake_message(offset) for offset in (15, 16, 17)]
    stage._process(arrived)  # the partition is committing: held, not written
    task = stage.pool.get(("in", 0))
    assert task is not None and task.backlog == arrived
    release.set()
    stage._collect_commits(wait=True)
    assert task.backlog == [] and task.txn is not None
    assert (task.txn.first_offset, task.txn.next_offset) == (15, 18)
    (offset, _), _ = producer.send_offsets.call_args
    assert offset == 15  # the first transaction ended before the held records


def fake_message(offset: int) -> MagicMock:
    msg = MagicMock()
    msg.error.return_value = None
    msg.topic.return_value, msg.partition.return_value = "in", 0
    msg.offset.return_value = offset
    msg.timestamp.return_value = (1, 0)
    msg.key.return_value, msg.value.return_value = b"k", str(offset).encode()
    msg.headers.return_value = None
    return msg


@pytest.mark.parametrize(
    ("code", "records", "refused", "isolating"),
    [
        (KafkaError.INVALID_RECORD, 5, {}, True),     # among others: find it, one at a time
        (KafkaError.INVALID_RECORD, 1, {10: "x"}, False),  # alone: it is the culprit
        (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, 1, {}, False),  # librdkafka's epoch bump
    ],
)
def test_a_refused_output_is_traced_to_its_record(stage: Stage, code: int, records: int,
                                                  refused: dict[int, str],
                                                  isolating: bool) -> None:
    producer = open_transaction(stage, 10, 10 + records - 1)
    producer.commit.side_effect = error(AbortableError, code, txn_requires_abort=True)
    commit(stage)
    task = stage.pool.get(("in", 0))
    assert task is not None
    assert set(task.refused) == set(refused)
    assert (task.isolate_until == 10 + records) is isolating
