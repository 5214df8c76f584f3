"""Who takes the consumer's group metadata for a commit, and when.

Exactly-once sends it with the transaction's offsets, so it is taken as the commit
starts, on the loop thread (the consumer is that thread's), and carried into the job.
At-least-once commits offsets through the consumer itself and never needs it; taking
it anyway cost the loop 0.1-0.3 ms a commit, eighty times a second at 8 partitions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from confluent_kafka import Message

from service.stage import machine as sm
from tests.unit.fakes import (
    TOPIC,
    GroupConsumer,
    OrderedCommitter,
    batch,
    make_loop,
    message,
    positioned,
)
from tests.unit.test_exactly_once_committer import committer_with_one_producer


@dataclass
class CountingConsumer(GroupConsumer):
    metadata_taken: int = 0

    def consumer_group_metadata(self) -> object:
        self.metadata_taken += 1
        return "metadata"


def test_a_commit_whose_committer_does_not_ask_takes_no_group_metadata() -> None:
    poisoned = Message(topic=TOPIC, partition=0, offset=2812, key=b"k", value=b"not a number",
                       headers=None, error=None, timestamp=message(2812).timestamp())
    consumer = CountingConsumer(batches=[[*batch(2810, 2811), poisoned]])
    loop, _, partition = make_loop(consumer)
    committer = OrderedCommitter()  # as at-least-once: the metadata is never called for
    loop.committer = committer  # type: ignore[assignment]
    positioned(loop, partition, 2810)
    loop.iterate()
    assert ("commit", 2812) in committer.calls  # the poison record's prefix commits
    assert consumer.metadata_taken == 0


def test_exactly_once_takes_the_metadata_as_the_commit_starts_not_in_its_job() -> None:
    committer, _ = committer_with_one_producer()
    taken_on: list[threading.Thread] = []

    def take() -> object:
        taken_on.append(threading.current_thread())
        return "metadata"

    job = committer.commit(("in", 0), sm.Txn(0, 5, 5, 0.0), take)
    assert callable(job)
    assert taken_on == [threading.current_thread()]  # now, by the caller: the loop thread
