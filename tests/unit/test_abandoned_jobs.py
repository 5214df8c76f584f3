"""A job whose partition is given up while it runs is abandoned; what it finds is still
reported when it is a fence.

CI saw it (test_zombie_is_fenced_after_rebalance, consumer protocol): a replica paused
past its session time-out resumed, started the commits that had fallen due while it was
stopped, and only then heard its partitions were lost. The commits met the successor's
fence, but they were abandoned, so nothing said so. The loop runs against the scripted
consumer of test_positioning.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from confluent_kafka import KafkaError
from structlog.testing import capture_logs

from service.errors import FencedError, Where
from service.stage import state as sm
from service.stage.partition import TopicPartitionKey
from tests.unit.test_positioning import RecordingCommitter, ScriptedConsumer, make_loop


@dataclass
class DetachingCommitter(RecordingCommitter):
    def transactional_id(self, key: TopicPartitionKey) -> str:
        return f"g.{key[0]}.{key[1]}"

    def detach(self, key: TopicPartitionKey) -> object:
        return lambda: None


def test_a_fence_found_by_a_commit_abandoned_on_loss_is_reported() -> None:
    loop, _, partition = make_loop(ScriptedConsumer())
    loop.committer = DetachingCommitter()  # type: ignore[assignment]
    partition.state = replace(partition.state, phase=sm.Phase.COMMITTING,
                              txn=sm.Txn(0, 10, 10, 0.0))
    answer = threading.Event()
    fenced = FencedError(Where("send_offsets_to_transaction", "g.in.0", "in", 0),
                         KafkaError(KafkaError._FENCED, "fenced by a newer instance"))
    loop.jobs.start(partition, lambda: (answer.wait(5), sm.CommitFailed(fenced, (), 0.0))[1])
    loop.release([partition.key], lost=True, reason="lost", deadline=time.monotonic())
    assert partition.key not in loop.partitions  # lost: the commit was not waited for
    answer.set()
    deadline = time.monotonic() + 5
    with capture_logs() as logs:
        while time.monotonic() < deadline and not any(
                e["event"] == "producer.fenced" for e in logs):
            loop.settle(time.monotonic())
            time.sleep(0.01)
    fence, = [e for e in logs if e["event"] == "producer.fenced"]
    assert fence["on"] == "abandoned" and fence["transactional_id"] == "g.in.0"
    assert loop.metrics.producers_fenced._value.get() == 1
