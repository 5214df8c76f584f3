"""At-least-once offset commits: a failed asynchronous commit is sent again unless a
newer offset was sent since or the partition is no longer ours; a window commits only
once every output in it was reported delivered. No broker: the producer points at a
closed port (its outputs are reported failed when they time out) and the consumer's
commit is a recorder; where the loop takes part, it runs against test_positioning's
scripted consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, TopicPartition
from prometheus_client import CollectorRegistry

from service.contract.processing import Produced
from service.contract.records import Record
from service.errors import KafkaOperationError, PoisonRecordError
from service.examples.square import square
from service.kafka.cluster import OutputLimits
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import load_settings
from service.stage import machine as sm
from service.stage.guarantees.at_least_once import AtLeastOnce
from service.stage.loop import Loop
from service.stage.machine import DeliveryFailed, Event
from service.stage.partition import Partition
from service.stage.replica import Stage
from tests.unit.fakes import POLICY, ScriptedConsumer, batch, make_loop, positioned

KEY = ("in", 3)
SETTINGS = {
    "TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    "TXSTAGE_GROUP_ID": "grp",
    "TXSTAGE_INPUT_TOPICS": "in",
    "TXSTAGE_OUTPUT_TOPIC": "out",
    "TXSTAGE_TRANSFORM": "service.examples.square:square",
    "TXSTAGE_GUARANTEE": "at_least_once",
    "TXSTAGE_PRODUCER__MESSAGE_TIMEOUT_MS": "300",
}


def alo_loop(consumer: ScriptedConsumer, settings: dict[str, str] | None = None,
             **policy: Any) -> tuple[Loop, AtLeastOnce, Partition, list[list[TopicPartition]]]:
    """The loop with an at-least-once committer (the producer at a closed port); the
    offsets it commits are appended to the returned list."""
    sent: list[list[TopicPartition]] = []
    alo = AtLeastOnce(load_settings(settings or SETTINGS), Metrics(CollectorRegistry()),
                      lambda offsets, asynchronous: sent.append(offsets))
    loop, _, partition = make_loop(consumer, TXSTAGE_GUARANTEE="at_least_once")
    loop.committer = alo
    loop.policy = replace(POLICY, renew_after_abort=False, **policy)
    return loop, alo, partition, sent


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


def reported(alo: AtLeastOnce) -> list[tuple[tuple[str, int], Event]]:
    """Poll until the (unreachable) producer's outputs time out and are reported."""
    events: list[tuple[tuple[str, int], Event]] = []
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        events = alo.poll(time.monotonic())
        time.sleep(0.05)
    return events


def record(offset: int) -> Record:
    return Record(KEY[0], KEY[1], offset, 0, None, b"")


def output(value: bytes) -> Produced:
    return Produced("out", None, value, [])


def test_a_window_waits_for_every_output_and_a_failed_one_names_its_record(
        committer: AtLeastOnce, sent: list[list[TopicPartition]]) -> None:
    """Successes are counted without a Python call each (delivery.report.only.error):
    the window must still see outputs in flight, and failures must still name the
    input record they came from."""
    committer.write(KEY, 0, [output(b"a"), output(b"b")])
    committer.write(KEY, 1, [])
    committer.write(KEY, 2, [output(b"c")])
    committer.commit(KEY, None, lambda: None)  # type: ignore[arg-type]
    window = committer._windows[KEY][0]
    assert window.in_flight == 2  # records 0 and 2; record 1 wrote nothing
    assert committer.poll(100.0) == [] and sent == []  # in flight: nothing commits
    (key, event), = reported(committer)
    assert key == KEY and isinstance(event, DeliveryFailed)
    assert sorted(f.offset for f in event.failures) == [0, 0, 2]
    assert {f.name for f in event.failures} == {"_MSG_TIMED_OUT"}
    assert window.in_flight == 0 and not window.delivered and sent == []


def test_outputs_written_unnamed_are_counted_and_their_failure_says_how_far_to_name(
        committer: AtLeastOnce, sent: list[list[TopicPartition]]) -> None:
    """A flowing partition writes unnamed (one callback object for every output): the
    window still waits for each output, and a failure tells the state machine the end
    of the window, up to which the records are written again named."""
    committer.write_run(KEY, [(record(offset), [output(b"a"), output(b"b")])
                              for offset in range(5, 8)])
    committer.commit(KEY, None, lambda: None)  # type: ignore[arg-type]
    window = committer._windows[KEY][0]
    assert window.in_flight == 6  # outputs, not records: all share one callback
    assert committer.poll(100.0) == [] and sent == []
    (key, event), = reported(committer)
    assert key == KEY and isinstance(event, DeliveryFailed) and event.through == 8
    assert [f.offset for f in event.failures] == [None] * 6
    assert window.in_flight == 0 and sent == []


def test_a_run_whose_write_fails_ends_its_window_before_the_failed_record(
        committer: AtLeastOnce) -> None:
    # librdkafka refuses an output larger than message.max.bytes in produce() itself.
    too_large = Produced("out", None, b"x" * 2_000_000, [])
    run = [(record(5), [output(b"a")]), (record(6), [too_large]), (record(7), [output(b"c")])]
    failed_at = None
    try:
        committer.write_run(KEY, run)
    except KafkaOperationError as exc:  # (its traceback holds the window's callback)
        failed_at = exc.where.offset
    assert failed_at == 6
    window = committer._windows[KEY][0]
    assert window.next == 6 and window.in_flight == 1  # record 5's output is queued


def test_a_delivery_failure_while_positioning_does_not_stop_the_partitions_commits() -> None:
    """A poison retry seals the good prefix and reads the position at once, its outputs
    still in flight. Their failure came while the partition was POSITIONING: the state
    machine ignored it, the committer kept it blamed and the failed window at the head
    of the partition's queue. Nothing of the partition was committed again and no
    later failure reported."""
    consumer = ScriptedConsumer(batches=[batch(0, 4)])
    loop, alo, partition, sent = alo_loop(consumer, retry_backoff_s=0.0)
    answer = threading.Event()
    loop.limits = SimpleNamespace(lookup=loop.limits.lookup,  # type: ignore[assignment]
                                  forget=lambda: None,
                                  cluster=SimpleNamespace(
                                      committed_offset=lambda *a, **k: (answer.wait(10), 0)[1]))
    try:
        alo.init(partition.key)()
        positioned(loop, partition, 0)
        loop.iterate()  # 0..4 written; their outputs time out (no broker)
        poison = PoisonRecordError("in", 0, 5, ValueError("transient"))
        loop.dispatch(partition, sm.Poisoned(poison, time.monotonic()))
        assert partition.state.phase is sm.Phase.POSITIONING  # the lookup waits for answer
        deadline = time.monotonic() + 10
        while len(alo._producer) and time.monotonic() < deadline:  # reports outstanding
            loop.settle(time.monotonic())
            time.sleep(0.05)
        loop.settle(time.monotonic())  # every report served: the failure is dispatched
        answer.set()
        while partition.state.phase is not sm.Phase.ACTIVE and time.monotonic() < deadline:
            loop.settle(time.monotonic())
            time.sleep(0.01)
        loop.transform = lambda record: []  # the retry needs no broker
        loop.dispatch(partition, sm.Tick(time.monotonic()))  # the backoff is over
        consumer.batches = [batch(0, 9)]
        loop.iterate()
        loop.dispatch(partition, sm.CommitDue(time.monotonic()))
        alo.poll(time.monotonic())
        assert [offsets(b) for b in sent] == [[("in", 0, 10)]]
    finally:
        answer.set()
        alo.shutdown(0)


def test_a_healthy_release_right_after_a_seal_commits_the_delivered_offsets() -> None:
    """Revoked or stopped with no window open (one sealed a moment before, its offsets
    delivered but waiting for the commit interval): the partition was finished as if
    unhealthy, its delivered offsets dropped, and the next owner redid the window."""
    consumer = ScriptedConsumer(batches=[batch(0, 9), batch(10, 19)])
    loop, alo, partition, sent = alo_loop(consumer, commits_deferred=True)
    loop.transform = lambda record: []  # nothing to deliver: no broker needed
    try:
        alo.init(partition.key)()
        positioned(loop, partition, 0)
        for now in (100.0, 100.01):  # (the poll's clock: within one commit interval)
            loop.iterate()
            loop.dispatch(partition, sm.CommitDue(time.monotonic()))  # sealed
            alo.poll(now)  # delivered: the first commits at once, the second waits
        assert partition.state.txn is None
        assert [offsets(b) for b in sent] == [[("in", 0, 10)]]
        loop.release([partition.key], lost=False, reason="shutdown",
                     deadline=time.monotonic() + 1)
        assert [offsets(b) for b in sent] == [[("in", 0, 10)], [("in", 0, 20)]]
    finally:
        alo.shutdown(0)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_the_stage_tells_the_state_machine_which_commits_are_deferred(guarantee: str) -> None:
    # Without it a healthy at-least-once release would commit only an open window.
    settings = load_settings({**SETTINGS, "TXSTAGE_GUARANTEE": guarantee})
    stage = Stage(settings, square, Metrics(CollectorRegistry()), Health(),
                  cast(OutputLimits, SimpleNamespace(lookup=lambda topic: 1_000_000,
                                                    producer_max_bytes=1_000_000)),
                  session_timeout_s=45.0)
    try:
        policy = stage.loop.policy
        assert policy.commits_deferred is (guarantee == "at_least_once")
        assert policy.renew_after_abort is (guarantee == "exactly_once")
    finally:
        stage.consumer.close()
        stage.committer.shutdown(0)
        stage.loop.jobs.shutdown()


def test_a_release_waits_for_outputs_in_flight_only_until_its_deadline() -> None:
    """Revoked while the broker does not answer: each partition's outputs stay in
    flight. The wait for them was 10 s per partition, whatever the release's deadline,
    so a revoke of N partitions held the loop (and the group's rebalance, and a
    SIGTERM's budget) for N x 10 s. Now the release as a whole ends by its deadline."""
    settings = {**SETTINGS, "TXSTAGE_PRODUCER__MESSAGE_TIMEOUT_MS": "120000"}
    loop, alo, first, sent = alo_loop(ScriptedConsumer(), settings, commits_deferred=True)
    second = Partition("in", 1)
    second.state = sm.PartitionState(sm.Phase.POSITIONING)
    loop.partitions[second.key] = second
    try:
        for partition in (first, second):
            alo.init(partition.key)()
            positioned(loop, partition, 0)
            alo.write(partition.key, 0, [Produced("out", b"k", b"v", [])])  # never delivered
        started = time.monotonic()
        loop.release([first.key, second.key], lost=False, reason="revoked",
                     deadline=started + 0.5)
        assert time.monotonic() - started < 2.5
        assert not loop.recorded  # (an error in a release is recorded, not raised)
        assert sent == []  # nothing was delivered: nothing committed
        assert not loop.partitions
    finally:
        alo.shutdown(0)


def test_a_sealed_window_is_not_counted_as_a_commit_until_kafka_commits_its_offsets() -> None:
    # A seal counted as a commit: txstage_transactions_committed_total and the last
    # commit's time advanced while no offset was committed (outputs undelivered), so
    # TxstageNoCommitsWhileLagging could never fire in this mode.
    loop, alo, partition, _ = alo_loop(ScriptedConsumer(batches=[batch(0, 4)]))
    alo._metrics = loop.metrics  # one registry for the loop's and the committer's counts
    positioned(loop, partition, 0)
    loop.iterate()
    loop.dispatch(partition, sm.CommitDue(time.monotonic()))  # sealed
    committed, last = loop.metrics.committed._value, loop.metrics.last_commit._value
    assert (committed.get(), last.get()) == (0, 0), "a seal was counted as a commit"
    # Kafka's answer, as the replica's on_commit passes it on: a confirmed commit is
    # counted by the loop's reporter, a failed one is not.
    for error, offsets in ((None, [TopicPartition("in", 0, 5)]),
                           (KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [])):
        if alo.offsets_committed(error, offsets):
            loop.reporter.offsets_committed()
    assert committed.get() == 1 and last.get() > 0
