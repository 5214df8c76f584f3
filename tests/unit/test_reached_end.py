"""ReachedEnd, row by row: a partition that read past its last record (commit markers,
aborted records) commits that end, never past a record it did not process."""

from __future__ import annotations

from dataclasses import replace

from confluent_kafka import KafkaError, Message

from service.stage import machine as sm
from service.stage.machine import Pause, Phase
from tests.unit.fakes import TOPIC, ScriptedConsumer, batch, make_loop, positioned
from tests.unit.test_partition_state import AT_LEAST_ONCE, POLICY, active, kinds, step


def test_an_open_transaction_commits_the_end_past_the_markers() -> None:
    state = active(first=0, records=99)          # records 0..98 written
    state, actions = step(state, sm.ReachedEnd(99, 100, 0.05))
    assert actions == [] and state.txn is not None
    assert (state.txn.first, state.txn.next, state.txn.records) == (0, 100, 99)
    state, actions = step(state, sm.CommitDue(0.1))
    assert actions == [sm.StartCommit(state.txn)] and state.txn.next == 100
    state, _ = step(state, sm.CommitDone(0.01, 0.2))
    assert state.committed == 100 and state.txn is None


def test_an_end_that_is_not_where_the_transaction_ends_is_ignored() -> None:
    # Records 99.. were fetched but not processed (held, dropped): never past them.
    state = active(first=0, records=99)
    assert step(state, sm.ReachedEnd(120, 121, 0.05)) == (state, [])
    assert step(state, sm.ReachedEnd(50, 121, 0.05)) == (state, [])


def test_idle_at_its_end_an_offsets_only_transaction_opens_and_commits_when_due() -> None:
    state = active(first=0, records=99)
    state, _ = step(state, sm.CommitDue(0.1), sm.CommitDone(0.01, 0.2))
    assert state.committed == 99
    state, actions = step(state, sm.ReachedEnd(99, 100, 0.3))
    assert actions == [] and state.txn == sm.Txn(99, 100, 0, 0.3)
    assert not state.due(0.35, POLICY) and state.due(0.4, POLICY)
    state, actions = step(state, sm.CommitDue(0.4))
    assert state.phase is Phase.COMMITTING and actions == [sm.StartCommit(sm.Txn(99, 100, 0, 0.3))]
    state, _ = step(state, sm.CommitDone(0.01, 0.5))
    assert state.committed == 100 and state.txn is None


def test_positioned_at_the_committed_offset_an_idle_partition_commits_its_end() -> None:
    state = active(first=519)                    # a restart: Kafka says 519, a marker
    assert state.committed == 519
    state, _ = step(state, sm.ReachedEnd(519, 520, 1.0))
    assert state.txn == sm.Txn(519, 520, 0, 1.0)


def test_records_that_arrive_join_the_offsets_only_transaction() -> None:
    state = active(first=99)
    state, _ = step(state, sm.ReachedEnd(99, 100, 1.0))
    state, _ = step(state, sm.Wrote(100, 150, 50, 1.05, first_ts_ms=7, last_ts_ms=9))
    assert state.txn == sm.Txn(99, 150, 50, 1.0, 7, 9)


def test_nothing_committed_or_an_end_not_past_the_position_is_ignored() -> None:
    state = active(first=-1)                     # nothing committed: position unknown here
    assert step(state, sm.ReachedEnd(0, 5, 1.0)) == (state, [])
    state = active(first=10)
    assert step(state, sm.ReachedEnd(10, 10, 1.0)) == (state, [])
    assert step(state, sm.ReachedEnd(9, 12, 1.0)) == (state, [])


def test_paused_or_not_active_partitions_ignore_the_end() -> None:
    state = active(first=10)
    for paused in (Pause.BACKOFF, Pause.LOOKUP, Pause.BACKLOG):
        held = replace(state, pauses=frozenset({paused}))
        assert step(held, sm.ReachedEnd(10, 12, 1.0)) == (held, [])
    committing, _ = step(active(first=0, records=5), sm.CommitDue(1.0))
    assert step(committing, sm.ReachedEnd(5, 6, 1.0)) == (committing, [])
    for phase in (Phase.INITIALISING, Phase.POSITIONING, Phase.ABORTING, Phase.FENCED,
                  Phase.RELEASED):
        other = replace(state, phase=phase)
        assert step(other, sm.ReachedEnd(10, 12, 1.0))[0] == other


def test_an_offsets_only_transaction_is_committed_on_a_healthy_release() -> None:
    state, _ = step(active(first=10), sm.ReachedEnd(10, 12, 1.0))
    state, actions = step(state, sm.Released(False, 1.01, "stopping"))
    assert kinds(actions) == ["DropHeld", "Finish"]
    finish = actions[1]
    assert isinstance(finish, sm.Finish) and finish.commit and finish.txn == sm.Txn(10, 12, 0, 1.0)


def test_at_least_once_seals_the_end_like_a_window() -> None:
    state = active(first=0, records=4)
    state, _ = step(state, sm.CommitDue(1.0), sm.CommitDone(-1.0, 1.0), policy=AT_LEAST_ONCE)
    assert state.committed == 4
    state, _ = step(state, sm.ReachedEnd(4, 5, 1.1), policy=AT_LEAST_ONCE)
    assert state.txn == sm.Txn(4, 5, 0, 1.1)


# ------------------------------------------------------- the loop: where the end comes from


def eof(offset: int) -> Message:
    return Message(topic=TOPIC, partition=0, offset=offset,
                   error=KafkaError(KafkaError._PARTITION_EOF))


def test_the_loop_moves_the_open_transaction_to_the_end_past_the_marker() -> None:
    consumer = ScriptedConsumer(batches=[[*batch(2810, 2819), eof(2821)]])
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 2810)
    loop.iterate()
    assert partition.position == 2820 and partition.state.txn is not None
    assert partition.state.txn.next == 2821


def test_records_held_while_committing_keep_the_end_until_they_are_processed() -> None:
    consumer = ScriptedConsumer(batches=[batch(0, 9)])
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 0)
    loop.iterate()
    partition.state = replace(partition.state, phase=Phase.COMMITTING)
    consumer.batches.append([*batch(10, 14), eof(16)])
    loop.iterate()
    assert [m.offset() for m in partition.held] == [10, 11, 12, 13, 14]
    assert partition.fetched_end == (15, 16) and partition.read_to() == 10
    assert partition.state.txn is not None and partition.state.txn.next == 10  # not past 10


def test_an_end_from_before_a_seek_or_while_backing_off_is_not_kept() -> None:
    consumer = ScriptedConsumer()
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 100)          # the seek is made in this batch
    loop.consume_error(KafkaError(KafkaError._PARTITION_EOF), eof(500))
    assert partition.fetched_end is None
    loop.positions.next_batch()
    partition.seek.check_first = False
    partition.state = replace(partition.state, pauses=frozenset({Pause.BACKOFF}))
    loop.consume_error(KafkaError(KafkaError._PARTITION_EOF), eof(500))
    assert partition.fetched_end is None


def test_an_end_beyond_the_sought_offset_is_sought_again_once_then_trusted() -> None:
    # Nothing fetched after a seek to 100, and the end at 103: is 100..102 markers, or
    # did the fetcher start beyond 100? As for a first record: sought again, then trusted.
    consumer = ScriptedConsumer(batches=[[], [eof(103)], [], [eof(103)]])
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 100)
    loop.iterate()
    loop.iterate()
    assert consumer.calls.count(("seek", 100)) == 2 and partition.fetched_end is None
    loop.iterate()
    loop.iterate()
    assert partition.fetched_end == (100, 103) and not partition.seek.check_first
    assert partition.state.txn == sm.Txn(100, 103, 0, partition.state.txn.opened_at)


def test_records_out_in_workers_keep_the_end_until_they_are_processed() -> None:
    # TXSTAGE_WORKERS: records sent to the workers are neither held nor past the
    # position; an end reported meanwhile must not move the commit past them.
    consumer = ScriptedConsumer(batches=[batch(0, 9)])
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 0)
    loop.iterate()
    assert partition.state.txn is not None and partition.state.txn.next == 10
    partition.inflight, partition.inflight_next = 5, 15  # 10..14 out in workers
    loop.consume_error(KafkaError(KafkaError._PARTITION_EOF), eof(16))
    assert partition.fetched_end == (15, 16) and partition.read_to() == 10
    assert loop.positions.end_reached(partition, 1.0) is None
    assert partition.state.txn.next == 10, "committed past records still in workers"


class SentChunks:
    """A worker pool that only records what it is sent (TXSTAGE_WORKERS)."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[int]]] = []  # (epoch, offsets)
        self.in_flight = self.alive = self.restarts = self.timeouts = 0

    def busy_seconds(self) -> float:
        return 0.0

    def submit(self, key: object, owner: object, epoch: int, messages: list[Message],
               records: object, size: int) -> None:
        self.sent.append((epoch, [m.offset() for m in messages]))  # type: ignore[misc]
        self.in_flight += 1

    def serve(self, timeout: float = 0.0) -> None:
        pass

    def completed(self) -> list[object]:
        return []

    def discard(self, key: object) -> list[object]:
        return []


def test_records_before_an_end_go_out_before_the_end_is_looked_at() -> None:
    # Records 98, 99 and an end at 100, in one batch, just after a seek to 0. The end
    # was looked at first: beyond the sought offset, it sought again and took the one
    # re-check; the records, sent after it under the new epoch, then came back as
    # the first after that seek, were let through as a real gap, and 0..97 were
    # skipped for good. Sent first, they count as fetched: the end is kept, and the
    # first record's own check seeks when its result comes back.
    consumer = ScriptedConsumer()
    pool = SentChunks()
    loop, _, partition = make_loop(consumer, pool)  # type: ignore[arg-type]
    positioned(loop, partition, 0)
    loop.positions.next_batch()
    consumer.batches.append([*batch(98, 99), eof(100)])
    loop.iterate()
    [(epoch, offsets)] = pool.sent
    assert offsets == [98, 99] and epoch == partition.epoch
    assert partition.seek.rechecked is None, "the end took the first record's re-check"
    assert partition.fetched_end == (100, 100)
