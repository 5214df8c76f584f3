"""At-least-once offset commits: a failed asynchronous commit is sent again unless a
newer offset was sent since or the partition is no longer ours. No broker: the
producer is never used and the consumer's commit is a recorder."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import cast

import pytest
from confluent_kafka import KafkaError, TopicPartition
from prometheus_client import CollectorRegistry

from service.metrics import Metrics
from service.settings import load_settings
from service.stage.at_least_once import AtLeastOnce

KEY = ("in", 3)
SETTINGS = {
    "TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    "TXSTAGE_GROUP_ID": "grp",
    "TXSTAGE_INPUT_TOPICS": "in",
    "TXSTAGE_OUTPUT_TOPIC": "out",
    "TXSTAGE_TRANSFORM": "service.examples.square:square",
    "TXSTAGE_GUARANTEE": "at_least_once",
}


@pytest.fixture
def sent() -> list[list[TopicPartition]]:
    return []


@pytest.fixture
def committer(sent: list[list[TopicPartition]]) -> Iterator[AtLeastOnce]:
    alo = AtLeastOnce(load_settings(SETTINGS), Metrics(CollectorRegistry()),
                      lambda offsets, asynchronous: sent.append(offsets))
    alo.init(KEY)()
    yield alo
    alo.shutdown(0)


def deliver(alo: AtLeastOnce, first: int, last: int, now: float) -> None:
    """Records ``first..last`` with no outputs (nothing to wait for), then sealed."""
    for offset in range(first, last + 1):
        alo.write(KEY, offset, [])
    alo.commit(KEY, None, lambda: None)  # type: ignore[arg-type]
    alo.poll(now)


def failed(offset: int) -> tuple[KafkaError, list[TopicPartition]]:
    error = KafkaError(KafkaError.ILLEGAL_GENERATION)
    return error, [TopicPartition(KEY[0], KEY[1], offset)]


def offsets(batch: list[TopicPartition]) -> list[tuple[str, int, int]]:
    return [(tp.topic, tp.partition, tp.offset) for tp in batch]


def test_a_failed_commit_is_sent_again_at_the_next_interval(
        committer: AtLeastOnce, sent: list[list[TopicPartition]]) -> None:
    deliver(committer, 0, 9, now=100.0)
    assert [offsets(b) for b in sent] == [[("in", 3, 10)]]
    committer.offsets_committed(*failed(10))
    committer.poll(100.05)  # not yet: the interval
    assert len(sent) == 1
    committer.poll(100.2)
    assert [offsets(b) for b in sent] == [[("in", 3, 10)], [("in", 3, 10)]]


def test_a_failure_per_partition_counts_as_a_failure_too(
        committer: AtLeastOnce, sent: list[list[TopicPartition]]) -> None:
    deliver(committer, 0, 4, now=100.0)
    # librdkafka sets a partition's error; a TopicPartition built in Python cannot have one
    tp = SimpleNamespace(topic=KEY[0], partition=KEY[1], offset=5,
                         error=KafkaError(KafkaError.REBALANCE_IN_PROGRESS))
    committer.offsets_committed(None, [cast(TopicPartition, tp)])
    committer.poll(101.0)
    assert [offsets(b) for b in sent][-1] == [("in", 3, 5)]


def test_a_failure_overtaken_by_a_newer_commit_is_not_sent_again(
        committer: AtLeastOnce, sent: list[list[TopicPartition]]) -> None:
    deliver(committer, 0, 9, now=100.0)
    deliver(committer, 10, 19, now=101.0)
    committer.offsets_committed(*failed(10))  # the older one's result comes late
    committer.poll(102.0)
    assert [offsets(b) for b in sent] == [[("in", 3, 10)], [("in", 3, 20)]]


def test_a_success_is_not_sent_again(committer: AtLeastOnce,
                                     sent: list[list[TopicPartition]]) -> None:
    deliver(committer, 0, 9, now=100.0)
    committer.offsets_committed(None, [TopicPartition(KEY[0], KEY[1], 10)])
    committer.poll(101.0)
    assert len(sent) == 1


def test_a_partition_given_up_is_not_committed_again(
        committer: AtLeastOnce, sent: list[list[TopicPartition]]) -> None:
    deliver(committer, 0, 9, now=100.0)
    committer.detach(KEY)()
    committer.offsets_committed(*failed(10))
    committer.poll(101.0)
    assert len(sent) == 1
