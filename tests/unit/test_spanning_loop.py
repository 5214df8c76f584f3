"""TXSTAGE_TRANSACTIONS=spanning in the loop, with the real Spanning guarantee and the
loop's Span part over a producer that records what it is asked (no broker: the same
paths run against a real one in tests/integration/test_spanning_transactions.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar, cast

import pytest
from confluent_kafka import KafkaError, Message
from prometheus_client import CollectorRegistry

from service.errors import AbortableError, Failure, Where
from service.examples.square import square
from service.kafka.cluster import OutputLimits
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import load_settings
from service.stage import machine as sm
from service.stage.guarantees import spanning as spanning_module
from service.stage.guarantees.spanning import Spanning
from service.stage.loop import Loop
from service.stage.partition import Partition
from tests.unit.fakes import POLICY, TOPIC, ScriptedConsumer


class FakeProducer:
    """What the Spanning guarantee asks of its SpanningProducer, recorded; a commit
    waits for ``release`` (set: at once)."""

    made: ClassVar[list[FakeProducer]] = []

    def __init__(self, config: dict[str, Any], topic: str, **_: object) -> None:
        self.transactional_id = str(config["transactional.id"])
        self.in_transaction = False
        self.calls: list[tuple[str, object]] = []
        self.release = threading.Event()
        self.release.set()
        self.failing: dict[int, tuple[Failure, ...]] = {}  # partition -> its failed outputs
        FakeProducer.made.append(self)

    def init(self) -> None:
        self.calls.append(("init", None))

    def begin(self) -> None:
        self.in_transaction = True
        self.calls.append(("begin", None))

    def produce_for(self, key: tuple[str, int], outputs: list[object], offset: int) -> None:
        self.calls.append(("write", (key[1], offset)))

    def produce_run_for(self, key: tuple[str, int], run: list[Any]) -> None:
        self.calls.extend(("write", (key[1], record.offset)) for record, _ in run)

    def send_offsets_of(self, offsets: dict[tuple[str, int], int], metadata: object) -> None:
        self.calls.append(("offsets", {p: o for (_, p), o in offsets.items()}))

    def commit(self) -> None:
        self.calls.append(("commit starts", None))
        self.release.wait(10)
        if self.failing:
            raise AbortableError(Where("commit_transaction", self.transactional_id),
                                 KafkaError(KafkaError.INVALID_RECORD, "refused"))
        self.in_transaction = False
        self.calls.append(("committed", None))

    def abort(self) -> None:
        self.in_transaction = False
        self.calls.append(("abort", None))

    def take_failures_of(self, key: tuple[str, int]) -> tuple[Failure, ...]:
        return self.failing.pop(key[1], ())

    def poll(self) -> None:
        pass

    def close(self) -> None:
        self.calls.append(("close", None))

    def writes(self) -> list[tuple[int, int]]:
        return [cast("tuple[int, int]", what) for call, what in self.calls if call == "write"]


@dataclass
class GroupConsumer(ScriptedConsumer):
    calls: list[tuple[str, int]] = field(default_factory=list)

    def consumer_group_metadata(self) -> object:
        return "generation-1"


def msg(partition: int, offset: int) -> Message:
    return Message(topic=TOPIC, partition=partition, offset=offset, key=b"k",
                   value=str(offset).encode(), headers=None, error=None,
                   timestamp=(1, 1_700_000_000_000))


@pytest.fixture
def spanning_loop(monkeypatch: pytest.MonkeyPatch) -> tuple[Loop, GroupConsumer]:
    FakeProducer.made = []
    monkeypatch.setattr(spanning_module, "SpanningProducer", FakeProducer)
    settings = load_settings({"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:9", "TXSTAGE_GROUP_ID": "g",
                              "TXSTAGE_INPUT_TOPICS": TOPIC, "TXSTAGE_OUTPUT_TOPIC": "out",
                              "TXSTAGE_TRANSFORM": "service.examples.square:square",
                              "TXSTAGE_TRANSACTIONS": "spanning"})
    metrics = Metrics(CollectorRegistry())
    consumer = GroupConsumer()
    limits = cast(OutputLimits, SimpleNamespace(lookup=lambda topic: 1_000_000,
                                                forget=lambda: None))
    loop = Loop(settings, square, metrics, Health(), limits, cast(Any, consumer),
                Spanning(settings, metrics), POLICY)
    return loop, consumer


def join(loop: Loop, number: int, offset: int = 0) -> Partition:
    """A partition assigned to the loop: its init joins the replica's producer, and it
    is positioned at ``offset``."""
    partition = Partition(TOPIC, number)
    loop.partitions[partition.key] = partition
    partition.state = sm.PartitionState(sm.Phase.INITIALISING)
    event = loop.committer.init(partition.key)()
    assert isinstance(event, sm.InitDone)
    partition.state = sm.PartitionState(sm.Phase.POSITIONING)
    loop.dispatch(partition, sm.Positioned(offset, time.monotonic()))
    return partition


def settle_until(loop: Loop, done: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        loop.settle(time.monotonic())
        time.sleep(0.005)


def wait_for_commit_start(producer: FakeProducer) -> None:
    deadline = time.monotonic() + 5
    while ("commit starts", None) not in producer.calls:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_one_commit_carries_every_partitions_offsets(spanning_loop: Any) -> None:
    loop, consumer = spanning_loop
    a, b = join(loop, 0), join(loop, 1)
    consumer.batches.append([msg(0, 0), msg(0, 1), msg(1, 0)])
    loop.iterate()
    [producer] = FakeProducer.made
    assert producer.writes() == [(0, 0), (0, 1), (1, 0)]
    loop.dispatch(a, sm.CommitDue(time.monotonic()))  # one is due: both commit
    assert a.state.phase is b.state.phase is sm.Phase.COMMITTING
    settle_until(loop, lambda: a.state.phase is b.state.phase is sm.Phase.ACTIVE)
    offsets = [what for call, what in producer.calls if call == "offsets"]
    assert offsets == [{0: 2, 1: 1}]
    assert [call for call, _ in producer.calls].count("commit starts") == 1


def test_a_partition_that_turns_active_mid_commit_writes_only_after_it(
        spanning_loop: Any) -> None:
    loop, consumer = spanning_loop
    a = join(loop, 0)
    consumer.batches.append([msg(0, 0)])
    loop.iterate()
    [producer] = FakeProducer.made
    producer.release.clear()  # the commit hangs until released
    loop.dispatch(a, sm.CommitDue(time.monotonic()))
    wait_for_commit_start(producer)
    c = join(loop, 2)  # positioned while the commit runs: joins it, empty
    assert c.state.phase is sm.Phase.COMMITTING
    consumer.batches.append([msg(2, 0), msg(2, 1)])
    loop.polled_at -= 1  # consume() is due, however long the commit runs
    loop.iterate()
    assert producer.writes() == [(0, 0)], "nothing written while the transaction commits"
    assert [m.offset() for m in c.held] == [0, 1]
    producer.release.set()
    settle_until(loop, lambda: c.state.phase is sm.Phase.ACTIVE and not c.held
                 and a.state.phase is sm.Phase.ACTIVE)
    after = producer.calls.index(("committed", None))
    assert [what for call, what in producer.calls[after:] if call == "write"] == [(2, 0), (2, 1)]


def test_the_loop_waits_for_the_replicas_commit_instead_of_consuming_to_hold(
        spanning_loop: Any) -> None:
    loop, consumer = spanning_loop
    a, b = join(loop, 0), join(loop, 1)
    consumer.batches.append([msg(0, 0), msg(1, 0)])
    loop.iterate()
    [producer] = FakeProducer.made
    producer.release.clear()  # the commit hangs until released
    loop.dispatch(a, sm.CommitDue(time.monotonic()))
    wait_for_commit_start(producer)
    consumer.batches.append([msg(0, 1), msg(1, 1)])
    loop.polled_at = time.monotonic()  # consume() has just returned
    loop.iterate()
    assert consumer.batches, "nothing consumed while every partition waits for the commit"
    assert not a.held and not b.held
    loop.polled_at -= 1  # past the longest wait: consume() runs, and its records are held
    loop.iterate()
    assert not consumer.batches
    assert [m.offset() for m in a.held] == [1] and [m.offset() for m in b.held] == [1]
    producer.release.set()
    settle_until(loop, lambda: not a.held and not b.held
                 and a.state.phase is b.state.phase is sm.Phase.ACTIVE)
    after = producer.calls.index(("committed", None))  # in the order their commits ended
    assert sorted(what for call, what in producer.calls[after:] if call == "write") == [
        (0, 1), (1, 1)]


def test_one_partitions_abort_rewinds_the_others_with_one_abort(
        spanning_loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, consumer = spanning_loop
    a, b, c = join(loop, 0), join(loop, 1), join(loop, 2)
    start = loop.jobs.start  # the inits after the abort are run by hand, below
    monkeypatch.setattr(loop.jobs, "start", lambda partition, job, startup=False:
                        None if startup else start(partition, job))
    consumer.batches.append([msg(0, 0), msg(1, 0)])
    loop.iterate()
    [producer] = FakeProducer.made
    error = spanning_module.shared_abort("produce", "tid", "refused")
    loop.dispatch(a, sm.ProduceFailed(error, time.monotonic()))
    assert {p.state.phase for p in (a, b, c)} == {sm.Phase.ABORTING}
    settle_until(loop, lambda: all(p.state.phase is sm.Phase.INITIALISING for p in (a, b, c)))
    assert [call for call, _ in producer.calls].count("abort") == 1
    # Their inits make one new producer (the old one's abort ran first), shared again.
    for partition in (a, b, c):
        assert isinstance(loop.committer.init(partition.key, replacing=True)(), sm.InitDone)
    assert len(FakeProducer.made) == 2


def test_a_revoke_commits_every_partition_then_releases(spanning_loop: Any) -> None:
    loop, consumer = spanning_loop
    a, b = join(loop, 0), join(loop, 1)
    consumer.batches.append([msg(0, 0), msg(1, 0), msg(1, 1)])
    loop.iterate()
    [producer] = FakeProducer.made
    loop.release([a.key], lost=False, reason="revoked", deadline=time.monotonic() + 5)
    assert a.key not in loop.partitions and b.state.phase is sm.Phase.ACTIVE
    assert [what for call, what in producer.calls if call == "offsets"] == [{0: 1, 1: 2}]
    assert ("abort", None) not in producer.calls and ("close", None) not in producer.calls


def test_a_refusal_in_one_partition_is_bisected_there_only(spanning_loop: Any) -> None:
    loop, consumer = spanning_loop
    a, b = join(loop, 0), join(loop, 1)
    consumer.batches.append([msg(0, 0), msg(0, 1), msg(1, 0), msg(1, 1)])
    loop.iterate()
    [producer] = FakeProducer.made
    producer.failing = {0: (Failure(KafkaError.INVALID_RECORD, "INVALID_RECORD", "refused",
                                    None),)}
    loop.dispatch(a, sm.CommitDue(time.monotonic()))
    settle_until(loop, lambda: a.state.phase is not sm.Phase.COMMITTING
                 and b.state.phase is not sm.Phase.COMMITTING)
    settle_until(loop, lambda: all(p.state.phase is sm.Phase.INITIALISING for p in (a, b)))
    assert a.state.isolation is not None  # its refused output is looked for: bisection
    assert b.state.isolation is None and not b.state.suspects  # b only went along
    assert b.state.abort_streak == 0


def test_a_partition_that_joins_as_it_turns_active_leaves_its_held_records_alone(
        spanning_loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # CommitDone while the generation commits again: the partition joins at once, then
    # its DrainHeld runs. It held every record again, one by one, each time: at 64
    # partitions on a backlog each record went through the loop seven times.
    loop, consumer = spanning_loop
    a = join(loop, 0)
    consumer.batches.append([msg(0, 0)])
    loop.iterate()
    [producer] = FakeProducer.made
    producer.release.clear()
    loop.dispatch(a, sm.CommitDue(time.monotonic()))
    consumer.batches.append([msg(0, 1), msg(0, 2)])
    loop.polled_at -= 1  # consume() is due
    loop.iterate()
    assert [m.offset() for m in a.held] == [1, 2]
    processed: list[int] = []
    monkeypatch.setattr(loop.runner, "process", lambda messages, *_: processed.extend(
        m.offset() for m in messages))
    loop.runner.drain(a)  # still committing: nothing to drain yet
    assert processed == [] and [m.offset() for m in a.held] == [1, 2]
    producer.release.set()
