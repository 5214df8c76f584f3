"""The clock, not the consumed batch, bounds a transaction, a stop and the heartbeat
(docs/state-machine.md, "Time bounds the work"). The transforms here take real time
(20 ms a record), as the ones that found the defects did.

The loop runs against the scripted consumer of test_positioning and the ordered
committer of test_loop_runs. Each test failed on the code before the fix: the whole
batch ran before any commit, stop or beat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from confluent_kafka import Message
from structlog.testing import capture_logs

from service import Output, Record
from service.examples.square import square
from service.observability.health import Health
from service.stage import machine as sm
from service.stage.loop import Loop
from service.stage.partition import Partition, TopicPartitionKey
from tests.unit.fakes import POLICY, GroupConsumer, OrderedCommitter, batch, make_loop, positioned

DELAY_S = 0.02


def slow(record: Record) -> Iterator[Output]:
    time.sleep(DELAY_S)
    yield from square(record)


def slow_loop(batches: int = 1, records: int = 30, interval_s: float = 0.1,
              transform: Callable[[Record], Iterator[Output]] = slow, **policy: float
              ) -> tuple[Loop, OrderedCommitter, Partition]:
    loop, _, partition = make_loop(GroupConsumer(batches=[
        batch(2810 + n * records, 2810 + (n + 1) * records - 1) for n in range(batches)]))
    committer = OrderedCommitter()
    loop.committer = committer  # type: ignore[assignment]
    loop.transform = transform
    loop.policy = replace(POLICY, commit_interval_s=interval_s, **policy)  # type: ignore[arg-type]
    positioned(loop, partition, 2810)
    return loop, committer, partition


def test_a_transaction_due_in_the_middle_of_a_batch_commits_there_and_holds_the_rest() -> None:
    # 30 records at 20 ms: 0.6 s of transform in one batch, a 100 ms commit interval.
    loop, committer, partition = slow_loop()
    loop.iterate()
    assert committer.txns, "nothing was committed during the batch"
    first = committer.txns[0]
    assert first.first == 2810 and first.records <= 8, first
    assert partition.state.phase is sm.Phase.COMMITTING
    # The rest of the batch waits, in order, for the commit: not lost, not run.
    held = [msg.offset() for msg in partition.held]
    assert held == list(range(first.next, 2840))
    assert committer.written == list(range(2810, first.next))


def test_a_full_transaction_commits_in_the_middle_of_a_fast_batch() -> None:
    loop, committer, partition = slow_loop(records=50, transform=square, commit_max_records=20)
    loop.iterate()
    assert [(txn.first, txn.records) for txn in committer.txns] == [(2810, 20)]
    assert [msg.offset() for msg in partition.held] == list(range(2830, 2860))


def test_a_stop_ends_the_batch_after_the_record_being_transformed() -> None:
    loop: Loop

    def stopped_at_2815(record: Record) -> Iterator[Output]:
        if record.offset == 2815:
            loop.interrupt()  # SIGTERM while this record is transformed
        yield from slow(record)

    loop, committer, partition = slow_loop(interval_s=60.0, transform=stopped_at_2815)
    started = time.monotonic()
    loop.iterate()
    assert time.monotonic() - started < 0.5, "the batch ran on after the stop"
    assert committer.written == list(range(2810, 2816))
    # What was processed is in the transaction the stop releases (commits).
    assert partition.state.txn is not None
    assert (partition.state.txn.first, partition.state.txn.next) == (2810, 2816)
    assert partition.position == 2816


def test_the_liveness_heartbeat_follows_records_not_batches() -> None:
    loop: Loop
    seen: list[bool] = []

    def looks_at_health(record: Record) -> Iterator[Output]:
        seen.append(loop.health.liveness()[0])
        yield from slow(record)

    loop, _, _ = slow_loop(records=60, interval_s=60.0, transform=looks_at_health,
                           poll_gap_s=5.0)
    loop.health = Health(stale_after=0.7)  # the batch takes 1.2 s
    loop.iterate()
    assert len(seen) == 60 and all(seen), seen


def test_a_transaction_open_for_half_its_timeout_is_warned_about_once() -> None:
    # 20 ms a record against a 30 ms transaction time-out: each commit starts with
    # more than half of it gone.
    loop, _, _ = slow_loop(interval_s=0.01, transaction_timeout_s=0.03)
    with capture_logs() as logs:
        loop.iterate()
        loop.tick(time.monotonic() + 1)
    warnings = [line for line in logs if line["event"] == "transaction.near_timeout"]
    assert len(warnings) == 1, logs
    assert warnings[0]["transaction_timeout_ms"] == 30
    assert "TXSTAGE_TRANSACTION_TIMEOUT_MS" in warnings[0]["note"]


def test_settling_drains_each_finished_commit_once_then_lets_the_loop_consume() -> None:
    # Commits that ended while held records drained were taken by the same settle:
    # with a slow transform two partitions drained their whole backlogs, commit after
    # commit, and the loop never returned to consume(). A chaos run (54 ms a record)
    # left the group on max.poll.interval.ms that way.
    loop, committer, first = slow_loop(records=50, interval_s=0.05)
    second = Partition(first.topic, 1)
    second.state, second.position, second.seek.check_first = first.state, 0, False
    loop.partitions[second.key] = second
    second.refresh_flowing()
    loop.consumer.batches.append([  # type: ignore[attr-defined]
        Message(topic=first.topic, partition=1, offset=o, key=b"k", value=b"2", headers=None,
                error=None, timestamp=(1, 1_700_000_000_000)) for o in range(50)])
    committer.commit = lambda key, txn, metadata: (  # type: ignore[method-assign]
        lambda: (time.sleep(0.005), sm.CommitDone(0.005, time.monotonic()))[1])
    loop.iterate()
    loop.iterate()
    assert min(len(first.held), len(second.held)) > 40
    time.sleep(0.05)  # both commits have ended
    started = time.monotonic()
    loop.settle(time.monotonic())
    assert time.monotonic() - started < 0.5, "settle drained the whole backlog"
    assert len(first.held) > 30 and len(second.held) > 30


def test_a_partition_committing_does_not_make_every_record_a_checkpoint() -> None:
    # A committing partition's transaction is past its due time: counted as open, it
    # made every record of every other partition a checkpoint (O(partitions) each),
    # and the exactly-once loop spent 2.5 times its CPU per record (bench.compare_trees).
    loop, _, first = slow_loop(records=500, transform=square)
    committing = Partition(first.topic, 1)
    committing.state = sm.PartitionState(sm.Phase.COMMITTING,
                                         txn=sm.Txn(0, 10, 10, time.monotonic() - 5.0))
    loop.partitions[committing.key] = committing
    checkpoints = []
    real = loop.runner._checkpoint
    loop.runner._checkpoint = lambda now: checkpoints.append(now) or real(now)  # type: ignore[method-assign]
    loop.iterate()
    assert first.position == 3310 and len(checkpoints) <= 2, len(checkpoints)


# ---------------------------------------------------------------- the gap between polls


class EarlyCommitter(OrderedCommitter):
    """Commits at once: at-least-once's seal (``CommitDone`` now) or, for exactly-once,
    a job that ends a few milliseconds later beside the loop."""

    def __init__(self, *, sealed: bool) -> None:
        super().__init__()
        self.sealed = sealed

    def commit(self, key: TopicPartitionKey, txn: sm.Txn, group_metadata: object) -> object:
        super().commit(key, txn, group_metadata)
        if self.sealed:
            return sm.CommitDone(-1.0, time.monotonic())
        return lambda: (time.sleep(0.003), sm.CommitDone(0.003, time.monotonic()))[1]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_one_iteration_returns_to_consume_within_the_poll_gap(guarantee: str) -> None:
    # 200 records at 10 ms in one batch: 2 s of transform. At-least-once never held a
    # record (its commit only seals a window), so the whole batch ran between two
    # consume() calls: rebalances, offset commits and delivery reports waited for it.
    sealed = guarantee == "at_least_once"
    loop, _, partition = slow_loop(records=200, interval_s=0.1, transform=slow10,
                                   poll_gap_s=0.5, commits_deferred=sealed,
                                   renew_after_abort=not sealed)
    committer = EarlyCommitter(sealed=sealed)
    loop.committer = committer  # type: ignore[assignment]
    gaps = []
    for _ in range(100):
        started = time.monotonic()
        loop.iterate()
        gaps.append(time.monotonic() - started)
        if partition.position == 3010 and not partition.held:
            break
        time.sleep(0.01)  # an exactly-once commit ends beside the loop
    assert max(gaps) < 0.5 + 0.2, gaps
    # Every record once, in order: what a yield handed back was processed first.
    assert committer.written == list(range(2810, 3010))
    assert partition.position == 3010


def slow10(record: Record) -> Iterator[Output]:
    time.sleep(0.01)
    yield Output(value=record.value)


def big(offset: int, size: int = 40_000) -> Message:
    return Message(topic="in", partition=0, offset=offset, key=b"k", value=b"7" * size,
                   headers=[("h", b"v")], error=None, timestamp=(1, 1_700_000_000_000))


def test_a_committing_partition_pauses_once_it_holds_its_bytes_limit() -> None:
    # 40 KB records: the count limit (5,000 records, 200 MB) let one lagging partition
    # hold 305 MB. At 100 KB the partition stops fetching at its third held record.
    loop, _, partition = slow_loop(records=0, transform=slow10,
                                   held_partition_max_bytes=100_000)
    loop.consumer.batches[:] = [[big(2810 + n) for n in range(10)]]  # type: ignore[attr-defined]
    partition.state = sm.PartitionState(sm.Phase.COMMITTING,
                                        txn=sm.Txn(2800, 2810, 10, time.monotonic()))
    loop.iterate()
    assert len(partition.held) == 10, "held, not dropped: librdkafka will not send them again"
    assert ("pause", 0) in loop.consumer.calls  # type: ignore[attr-defined]
    assert sm.Pause.BACKLOG in partition.state.pauses
    assert partition.held_bytes == loop.runner.held_bytes == 10 * (40_000 + 1 + 2)
    loop._housekeeping(time.monotonic() + 5)
    assert loop.metrics.held_bytes._value.get() == loop.runner.held_bytes  # type: ignore[attr-defined]
    assert loop.metrics.held_records._value.get() == 10  # type: ignore[attr-defined]


def test_a_commit_that_ends_resumes_its_partition_only_below_the_limits() -> None:
    # 40 KB records, exactly-once, 10 ms a record, a 20 ms commit interval: each drain
    # processed a few records before the next commit. The commit's end resumed the
    # partition whatever it held, so it fetched a batch a commit and held its whole lag.
    loop, _, partition = slow_loop(records=0, transform=slow10, interval_s=0.02,
                                   held_partition_max_bytes=100_000)
    loop.committer = EarlyCommitter(sealed=False)  # type: ignore[assignment]
    loop.consumer.batches[:] = [[big(2810 + n) for n in range(10)]]  # type: ignore[attr-defined]
    resumed_holding: list[int] = []
    loop.consumer.resume = lambda tps: resumed_holding.append(  # type: ignore[method-assign]
        partition.held_bytes)
    loop.iterate()
    assert sm.Pause.BACKLOG in partition.state.pauses, "the commit holds the rest: paused"
    for _ in range(40):
        loop.iterate()
        time.sleep(0.005)  # the commit's job ends beside the loop
    assert not partition.held, "all drained"
    assert resumed_holding and all(held < 100_000 for held in resumed_holding), resumed_holding


def test_records_handed_back_fetch_again_once_drained_below_the_limits() -> None:
    loop, committer, partition = slow_loop(records=0, transform=slow10, poll_gap_s=0.05,
                                           held_partition_max_bytes=100_000)
    committer = EarlyCommitter(sealed=True)
    loop.committer = committer  # type: ignore[assignment]
    loop.consumer.batches[:] = [[big(2810 + n) for n in range(10)]]  # type: ignore[attr-defined]
    loop.iterate()
    assert sm.Pause.BACKLOG in partition.state.pauses  # 50 ms: the rest handed back
    for _ in range(10):
        loop.iterate()
    assert committer.written == list(range(2810, 2820))
    assert not partition.held and loop.runner.held_bytes == 0
    assert sm.Pause.BACKLOG not in partition.state.pauses
    assert loop.consumer.calls[-1] == ("resume", 0)  # type: ignore[attr-defined]


def test_a_seek_drops_the_records_handed_back() -> None:
    # Held records fetched before a rewind would run ahead of the records the seek
    # fetches again, and those would then look stale: lost.
    loop, _, partition = slow_loop(records=100, transform=slow10, poll_gap_s=0.1,
                                           interval_s=60.0)
    loop.iterate()
    assert partition.held
    loop._execute(partition, sm.Seek(2815))  # an abort's rewind, say
    assert not partition.held and loop.runner.held_bytes == 0


def test_consume_waits_only_a_moment_while_a_commit_runs_or_records_are_held() -> None:
    # A committing or backlogged partition fetches nothing: a full TXSTAGE_POLL_TIMEOUT_MS
    # in consume() after each commit halved one lagging partition's pace (exactly-once,
    # 20 ms a record, a commit every 100 ms: 26 records/s against at-least-once's 44).
    loop, _, partition = slow_loop()
    assert loop._poll_timeout_s() == loop.settings.poll_timeout_ms / 1000
    loop.iterate()
    assert partition.state.phase is sm.Phase.COMMITTING and partition.held
    assert loop._poll_timeout_s() < 0.01
