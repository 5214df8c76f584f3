"""A job whose partition is given up while it runs is abandoned; what it finds is still
reported when it is a fence, and a producer it made is closed by the job itself.

A fence: CI saw it (test_zombie_is_fenced_after_rebalance, consumer protocol): a replica paused
past its session time-out resumed, started the commits that had fallen due while it was
stopped, and only then heard its partitions were lost. The commits met the successor's
fence, but they were abandoned, so nothing said so. The loop runs against the scripted
consumer of test_positioning.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from service.errors import FatalError, FencedError, Where
from service.observability.metrics import Metrics
from service.settings import load_settings
from service.stage import machine as sm
from service.stage.guarantees import exactly_once
from service.stage.guarantees.exactly_once import ExactlyOnce
from service.stage.loop import Loop
from service.stage.partition import Partition, TopicPartitionKey
from tests.unit.fakes import RecordingCommitter, ScriptedConsumer, make_loop


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


def test_a_fence_found_by_a_commit_ending_during_the_release_is_reported() -> None:
    # The same, the commit ending while the release runs: after the partition's
    # Released (its Abandon detaches the producer, here the moment the commit ends) the
    # release waits once more for the job and took its completion, fence and all,
    # without a word. Seen in CI once the close of an abandoned producer moved out of
    # the job (the future is done as soon as the commit returns).
    loop, _, partition = make_loop(ScriptedConsumer())
    answer = threading.Event()
    fenced = FencedError(Where("send_offsets_to_transaction", "g.in.0", "in", 0),
                         KafkaError(KafkaError._FENCED, "fenced by a newer instance"))

    class EndingOnDetach(DetachingCommitter):
        def detach(self, key: TopicPartitionKey) -> object:
            answer.set()  # the commit ends now
            assert partition.job is not None
            partition.job[1].result(5)
            return lambda: None

    loop.committer = EndingOnDetach()  # type: ignore[assignment]
    partition.state = replace(partition.state, phase=sm.Phase.COMMITTING,
                              txn=sm.Txn(0, 10, 10, 0.0))
    loop.jobs.start(partition, lambda: (answer.wait(5), sm.CommitFailed(fenced, (), 0.0))[1])
    with capture_logs() as logs:
        loop.release([partition.key], lost=True, reason="lost", deadline=time.monotonic())
        loop.settle(time.monotonic())
    assert [e["on"] for e in logs if e["event"] == "producer.fenced"] == ["abandoned"]
    assert loop.metrics.producers_fenced._value.get() == 1


class GatedProducer:
    """A pinned producer whose init_transactions returns when its test says so; it
    joins ``made`` as init_transactions starts."""

    made: list[GatedProducer]

    def __init__(self, config: dict[str, Any], topic: str, partition: int,
                 **_: object) -> None:
        self.transactional_id = config["transactional.id"]
        self.closed = False
        self.in_transaction = False
        self.answer = threading.Event()

    def init(self) -> None:
        self.made.append(self)
        assert self.answer.wait(5)

    def close(self) -> None:
        self.closed = True

    def poll(self) -> None:
        assert not self.closed, "a closed producer is polled"


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> list[GatedProducer]:
    made: list[GatedProducer] = []
    monkeypatch.setattr(GatedProducer, "made", made, raising=False)
    monkeypatch.setattr(exactly_once, "PinnedProducer", GatedProducer)
    return made


def exactly_once_loop() -> tuple[Loop, ExactlyOnce]:
    loop, _, partition = make_loop(ScriptedConsumer())
    del loop.partitions[partition.key]  # assigned by the test
    settings = load_settings({"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1",
                              "TXSTAGE_GROUP_ID": "g", "TXSTAGE_INPUT_TOPICS": "in",
                              "TXSTAGE_OUTPUT_TOPIC": "out",
                              "TXSTAGE_TRANSFORM": "service.examples.square:square"})
    committer = ExactlyOnce(settings, Metrics(CollectorRegistry()))
    loop.committer = committer
    loop.limits = SimpleNamespace(lookup=loop.limits.lookup,  # type: ignore[assignment]
                                  cluster=SimpleNamespace(committed_offset=lambda *a, **k: 100))
    return loop, committer


def until(condition: Callable[[], bool], loop: Loop, what: str = "") -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, f"not in 5 s: {what}"
        loop.settle(time.monotonic())
        time.sleep(0.01)


def test_a_producer_whose_init_outlived_its_release_is_closed_by_its_job(
        gated: list[GatedProducer]) -> None:
    # Released while init_transactions ran, the partition's Abandon detached nothing:
    # the producer was not registered yet. The job registered it when init returned:
    # never closed, polled for ever, holding the partition's transactional id.
    loop, committer = exactly_once_loop()
    loop.assign([TopicPartition("in", 0)])
    until(lambda: len(gated) == 1, loop)
    [producer] = gated
    loop.release([("in", 0)], lost=False, reason="revoked", deadline=time.monotonic())
    producer.answer.set()
    until(lambda: producer.closed, loop, "the abandoned init's producer closed")
    assert committer._producers == {}
    committer.poll(time.monotonic())  # (a closed producer polled would fail)


def test_an_abandoned_init_ending_late_leaves_the_next_assignments_producer_alone(
        gated: list[GatedProducer]) -> None:
    # Lost while its init ran (A) and given back at once (B): B was ready first and
    # the partition wrote through it; then A returned, closed B under the ACTIVE
    # partition and took its place.
    loop, committer = exactly_once_loop()
    loop.assign([TopicPartition("in", 0)])
    until(lambda: len(gated) == 1, loop)
    loop.release([("in", 0)], lost=True, reason="lost", deadline=time.monotonic())
    loop.assign([TopicPartition("in", 0)])
    until(lambda: len(gated) == 2, loop)
    old, new = gated
    new.answer.set()
    until(lambda: loop.partitions[("in", 0)].state.phase is sm.Phase.ACTIVE, loop)
    old.answer.set()
    until(lambda: old.closed, loop, "the abandoned init's producer closed")
    assert committer._producers == {("in", 0): new} and not new.closed
    committer.poll(time.monotonic())


def test_a_revoke_does_not_wait_for_an_init_whose_result_it_discards(
        gated: list[GatedProducer]) -> None:
    # The release waited (inside the rebalance callback) for the init job up to its
    # deadline, then abandoned it anyway: a stalled rebalance per revoke while a
    # coordinator moved.
    loop, _ = exactly_once_loop()
    loop.assign([TopicPartition("in", 0)])
    until(lambda: len(gated) == 1, loop)
    [producer] = gated
    started = time.monotonic()
    loop.release([("in", 0)], lost=False, reason="revoked", deadline=started + 3)
    assert time.monotonic() - started < 0.5, "the release waited for the init"
    producer.answer.set()
    until(lambda: producer.closed, loop, "the abandoned init's producer closed")


def test_the_replica_fails_once_four_calls_are_stuck_in_librdkafka() -> None:
    # Each stuck call keeps a thread of the 16 that run every commit, abort and close:
    # once they were all taken, every partition's commits queued for ever while
    # /healthz said 200. Past four the replica fails; its orchestrator restarts it.
    loop, _, first = make_loop(ScriptedConsumer())
    loop.committer = DetachingCommitter()  # type: ignore[assignment]
    hold = threading.Event()
    partitions = [first] + [loop.partitions.setdefault(("in", n), Partition("in", n))
                            for n in range(1, 4)]
    try:
        for n, partition in enumerate(partitions):
            partition.state = sm.PartitionState(sm.Phase.COMMITTING, txn=sm.Txn(0, 5, 5, 0.0))
            loop.jobs.start(partition, lambda: (hold.wait(10), None)[1])
            time.sleep(0.05)  # running, not queued
            if n < 3:
                loop.dispatch(partition, sm.CallStuck(999.0))
                assert partition.state.phase is sm.Phase.FENCED
        with pytest.raises(FatalError, match="4 calls on producers are stuck"):
            loop.dispatch(partitions[3], sm.CallStuck(999.0))
    finally:
        hold.set()
        loop.jobs.shutdown()
