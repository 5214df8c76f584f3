"""The loop's parts, each built alone (no Loop): the Reporter, Positioning and
Positions, the Housekeeper and the in-process runner. What each is given is all
it uses; what it decides comes back to its caller or goes to its own fakes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import cast

from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry

from service.errors import FencedError, Where
from service.examples.square import square
from service.kafka.cluster import OutputLimits
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import Settings, load_settings
from service.stage import machine as sm
from service.stage.fetch_watch import FetchWatch
from service.stage.guarantees.guarantee import ReleaseReport
from service.stage.housekeeping import Housekeeper
from service.stage.in_process import InProcess
from service.stage.jobs import Jobs
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.positioning import Positioning
from service.stage.positions import Positions
from service.stage.reports import Reporter
from service.stage.topic_lookups import TopicLookups
from service.stage.transform_watch import Marker
from tests.unit.fakes import POLICY, TOPIC, OrderedCommitter, ScriptedConsumer, batch


def settings(**env: str) -> Settings:
    return load_settings({"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:9", "TXSTAGE_GROUP_ID": "g",
                          "TXSTAGE_INPUT_TOPICS": TOPIC, "TXSTAGE_OUTPUT_TOPIC": "out",
                          "TXSTAGE_TRANSFORM": "service.examples.square:square", **env})


def active(number: int = 0, position: int = 2810) -> Partition:
    partition = Partition(TOPIC, number)
    partition.state = sm.PartitionState(sm.Phase.ACTIVE, committed=position)
    partition.position = position
    return partition


def counted(metrics: Metrics) -> tuple[float, float, float]:
    return (metrics.committed._value.get(), metrics.producers_fenced._value.get(),  # type: ignore[attr-defined]
            metrics.aborted.labels(reason="fenced")._value.get())  # type: ignore[attr-defined]


# --- Reporter ---------------------------------------------------------------------


def reporter(partitions: dict[TopicPartitionKey, Partition] | None = None
             ) -> tuple[Reporter, Metrics, Health]:
    metrics, health = Metrics(CollectorRegistry()), Health()
    return Reporter(metrics, health, partitions or {}, lambda key: "g.in.0"), metrics, health


def test_the_reporter_counts_a_commit_an_abort_and_a_fence_from_any_source() -> None:
    report, metrics, _ = reporter()
    partition = active()
    report.report(partition, sm.Committed(sm.Txn(0, 5, 5, time.monotonic()), 0.01), POLICY)
    assert counted(metrics) == (1, 0, 0)
    assert partition.committed_at > 0
    report.released(ReleaseReport(committed_s=0.02, records=3))  # a release's own commit
    report.offsets_committed()                                   # at-least-once's, confirmed
    assert counted(metrics) == (3, 0, 0)
    report.released(ReleaseReport(fenced=True))
    assert counted(metrics) == (3, 1, 1), "a fence with a transaction open aborted it"
    fenced = FencedError(Where("commit"), KafkaError(KafkaError._FENCED))
    report.abandoned(partition, sm.CommitFailed(fenced, (), 0.0))
    assert counted(metrics) == (3, 2, 2)
    report.abandoned(partition, ReleaseReport(aborted="revoked"))
    assert metrics.aborted.labels(reason="revoked")._value.get() == 1  # type: ignore[attr-defined]


def test_the_reporter_says_readiness_from_the_partitions_it_was_given() -> None:
    ready, waiting = active(0), Partition(TOPIC, 1)
    report, _, health = reporter({ready.key: ready, waiting.key: waiting})
    report.partitions()
    detail = health.readiness()[1]
    assert (detail["assigned"], detail["ready"]) == (2, 1)


# --- Positioning and Positions ----------------------------------------------------


def test_positioning_alone_seeks_where_it_started_when_nothing_was_committed() -> None:
    seek = Positioning()
    assert seek.settled and not seek.stale(batch=1)
    seek.started_at = 40
    assert seek.sought_at(-1, batch=3) == 40
    assert not seek.settled and seek.stale(batch=7), "pending: anything fetched is stale"
    seek.landed()
    assert seek.stale(batch=3) and not seek.stale(batch=4), "stale within its own batch only"
    seek.first_checked()
    assert seek.settled
    assert seek.restart_at(0) == 0 and seek.restart_at(12) == 12
    unknown = Positioning()
    unknown.sought_at(-1, batch=1)  # nothing committed, where it starts not known yet
    assert unknown.restart_at(0) == -1, "nothing read: seek to what was sought"


@dataclass
class Discards:
    partitions: list[Partition] = field(default_factory=list)

    def __call__(self, partition: Partition) -> None:
        self.partitions.append(partition)


def positions(consumer: ScriptedConsumer, *partitions: Partition,
              stall_after_s: float = 10.0) -> tuple[Positions, Discards]:
    discards = Discards()
    found = Positions(consumer, Metrics(CollectorRegistry()), settings(),  # type: ignore[arg-type]
                      {p.key: p for p in partitions}, discards, stall_after_s)
    return found, discards


def test_positions_alone_retry_a_refused_seek_until_it_lands_then_reassign() -> None:
    consumer, partition = ScriptedConsumer(refuse_seeks=1_000_000), active()
    seeks, discards = positions(consumer, partition)
    seeks.seek(partition, 2800)
    assert discards.partitions == [partition], "what it held is stale"
    assert ("pause", 0) in consumer.calls and partition.seek.seek_to == 2800
    assert seeks.stale(partition, 2805), "pending: read again after the seek"
    seeks.retry(1.0)   # refused since 1.0
    seeks.retry(11.0)  # refused past the fetch stall time: assigned afresh
    assert consumer.calls[-2:] == [("unassign", 0), ("assign at", 2800)]
    seeks.retry(12.0)
    assert partition.seek.seek_to is None and consumer.calls[-1] == ("resume", 0)


def test_positions_alone_check_the_first_record_after_a_seek() -> None:
    consumer, partition = ScriptedConsumer(), active()
    seeks, _ = positions(consumer, partition)
    seeks.seek(partition, 2810)
    seeks.next_batch()
    assert not seeks.check_first(partition, 2815), "from beyond the seek: sought again"
    assert consumer.calls[-1] == ("seek", 2810)
    seeks.next_batch()
    assert seeks.check_first(partition, 2812), "a gap that persists is real"
    assert partition.seek.settled


def test_positions_alone_hand_back_the_end_reached_as_an_event() -> None:
    partition = active(position=100)
    seeks, _ = positions(ScriptedConsumer(), partition)
    seeks.fetched_to_end(partition, 103)
    event = seeks.end_reached(partition, 1.0)
    assert event == sm.ReachedEnd(100, 103, 1.0)


# --- Housekeeper ------------------------------------------------------------------


def housekeeper(*partitions: Partition, **env: str) -> tuple[Housekeeper, Metrics]:
    metrics = Metrics(CollectorRegistry())
    table = {p.key: p for p in partitions}
    report = Reporter(metrics, Health(), table, lambda key: None)
    found = Housekeeper(settings(**env), metrics, ScriptedConsumer(), Jobs(),  # type: ignore[arg-type]
                        table, report, FetchWatch(0.0), POLICY.transaction_timeout_s)
    return found, metrics


def test_the_housekeeper_alone_hands_a_stuck_commit_back_as_an_event() -> None:
    stuck = active()
    stuck.state = sm.PartitionState(sm.Phase.COMMITTING)
    stuck.job, stuck.phase_since = (object(), None), 0.0  # type: ignore[assignment]
    keeper, _ = housekeeper(stuck)
    now = POLICY.stuck_after_s + 1
    chores = keeper.run(now, POLICY, 0, None, cast(OutputLimits, None))
    assert chores.events == [(stuck, sm.CallStuck(now))]
    assert keeper.run(now + 0.5, POLICY, 0, None, cast(OutputLimits, None)).events == [], \
        "once a second"


def test_the_housekeeper_alone_hands_back_the_interval_the_budget_sets() -> None:
    partitions = [active(n) for n in range(40)]
    now = time.monotonic()
    for partition in partitions:
        partition.committed_at = now
    keeper, metrics = housekeeper(*partitions, TXSTAGE_MAX_TRANSACTIONS_PER_S="20")
    policy = replace(POLICY, commit_interval_s=0.1, transaction_timeout_s=60.0)
    chores = keeper.run(now, policy, 0, None, cast(OutputLimits, None))
    assert chores.interval_s == 40 / 20
    assert metrics.commit_interval._value.get() == 2.0  # type: ignore[attr-defined]


# --- the in-process runner --------------------------------------------------------


@dataclass
class Host:
    """What a runner uses of its loop: its configuration and the events it hands back."""

    committer: OrderedCommitter = field(default_factory=OrderedCommitter)
    policy: sm.Policy = POLICY
    health: Health = field(default_factory=Health)
    events: list[tuple[Partition, sm.Event]] = field(default_factory=list)
    transform: object = square
    limits: object = field(default_factory=lambda: SimpleNamespace(
        lookup=lambda topic: 1_000_000, forget=lambda: None))

    def dispatch(self, partition: Partition, event: sm.Event) -> None:
        self.events.append((partition, event))

    def consume_error(self, error: KafkaError, msg: object) -> None:
        raise AssertionError(error)


def runner(host: Host, *partitions: Partition) -> InProcess:
    metrics = Metrics(CollectorRegistry())
    table = {p.key: p for p in partitions}
    seeks = Positions(ScriptedConsumer(), metrics, settings(), table,  # type: ignore[arg-type]
                      lambda p: None, 0.0)
    return InProcess(host, settings(), metrics, table, seeks,  # type: ignore[arg-type]
                     Reporter(metrics, Health(), table, lambda key: None),
                     TopicLookups(Jobs()), Marker())


def test_the_runner_alone_writes_a_partitions_results_in_order() -> None:
    host, partition = Host(), active()
    run = runner(host, partition)
    run.bound(time.monotonic() + 60)
    run.run(batch(2810, 2814), time.monotonic(), 0.0)
    assert host.committer.written == [2810, 2811, 2812, 2813, 2814]
    assert partition.position == 2815 and partition.state.txn is not None
    assert partition.state.txn.records == 5, "told the state machine at the batch's end"
    assert host.events == [], "nothing to decide"


def test_the_runner_alone_ends_the_batch_at_the_next_record_once_stopped() -> None:
    host, partition = Host(), active()
    run = runner(host, partition)
    run.bound(time.monotonic() + 60)

    def stopping(record: object) -> object:
        run.stop()  # the replica stops while this record is transformed
        return square(record)  # type: ignore[arg-type]

    host.transform = stopping
    run.run(batch(2810, 2814), time.monotonic(), 0.0)
    assert host.committer.written == [2810], "the rest is left to the next owner"


def test_the_runner_alone_holds_what_comes_past_the_poll_gap_bound() -> None:
    host, partition = Host(), active()
    run = runner(host, partition)
    run.bound(time.monotonic())  # the bound has passed already: handed back at once
    run.run(batch(2810, 2814), time.monotonic(), 0.0)
    assert host.committer.written == []
    assert [m.offset() for m in partition.held] == [2810, 2811, 2812, 2813, 2814]
    assert run.held_bytes > 0
    run.discard(partition)
    assert not partition.held and run.held_bytes == 0


def test_the_runner_reads_its_hosts_committer_as_it_is_now() -> None:
    host, partition = Host(), active()
    run = runner(host, partition)
    run.bound(time.monotonic() + 60)
    host.committer = other = OrderedCommitter()
    run.run(batch(2810, 2811), time.monotonic(), 0.0)
    assert other.written == [2810, 2811]
