"""Where a partition resumes after it is positioned (assigned, rewound): the loop
checks librdkafka instead of trusting it.

The consumer here is a script of librdkafka behaviours read from its source
(rdkafka_partition.c: a seek before the fetcher started is refused with _STATE and
leaves the "application position" as it was; a later pause moves the fetcher there),
not a Kafka: the loop's side of the bargain is what these tests pin down. The
committer records what the loop writes. The same paths run against a real broker
in tests/integration (the stall and chaos scenarios).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import SimpleNamespace

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    KafkaError,
    Message,
)

from service.errors import RetriableError, Where
from service.stage import machine as sm
from service.stage.partition import Partition
from tests.unit.fakes import (
    TOPIC,
    ScriptedConsumer,
    batch,
    make_loop,
    positioned,
)


def test_a_refused_seek_keeps_the_partition_paused_until_it_lands() -> None:
    # The old loop took _STATE to mean "librdkafka starts from the committed offset
    # itself" and resumed at once; librdkafka's application position was then left
    # as it was, and the next pause sent the fetcher there.
    consumer = ScriptedConsumer(refuse_seeks=2)
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 2810)
    assert ("resume", 0) not in consumer.calls
    loop.tick(1.0)
    assert ("resume", 0) not in consumer.calls, "still refused: still paused"
    loop.tick(2.0)
    assert consumer.calls[-2:] == [("seek", 2810), ("resume", 0)]
    assert partition.seek.seek_to is None


def test_a_seek_refused_past_the_fetch_stall_time_assigns_the_partition_afresh() -> None:
    # CI: a group coordinator killed as partitions were assigned. librdkafka's own
    # committed-offset query failed as a whole (NOT_COORDINATOR) and was never retried
    # (librdkafka#5586): every seek was refused for the rest of the run, the partition
    # stayed paused and the fetch watch, which skips paused partitions, never saw it.
    consumer = ScriptedConsumer(refuse_seeks=1_000_000)
    loop, _, partition = make_loop(consumer, TXSTAGE_FETCH_STALL_S="10")
    positioned(loop, partition, 2810)
    loop.tick(1.0)   # refused since 1.0
    loop.tick(10.9)
    assert ("unassign", 0) not in consumer.calls, "refused for less than 10 s"
    loop.tick(11.0)
    assert consumer.calls[-2:] == [("unassign", 0), ("assign at", 2810)]
    assert ("pause", 0) not in consumer.calls[-2:], "a pause would move the fetcher (see _seek)"
    assert partition.seek.seek_to == 2810, "the seek lands next, on the fetcher started there"
    loop.tick(11.5)
    assert consumer.calls[-2:] == [("seek", 2810), ("resume", 0)]
    assert partition.seek.seek_to is None and partition.seek.check_first
    loop.tick(30.0)
    assert consumer.calls.count(("unassign", 0)) == 1, "assigned afresh once"


def test_partitions_refused_together_are_assigned_afresh_in_one_call() -> None:
    # Every unassign or assign bumps librdkafka's assignment version, which drops an
    # offset query still out for the other partitions: one call for all of them.
    consumer = ScriptedConsumer(refuse_seeks=1_000_000)
    loop, _, first = make_loop(consumer, TXSTAGE_FETCH_STALL_S="10")
    second = Partition(TOPIC, 1)
    second.state = sm.PartitionState(sm.Phase.POSITIONING)
    loop.partitions[second.key] = second
    positioned(loop, first, 2810)
    positioned(loop, second, 77)
    loop.tick(1.0)
    loop.tick(11.0)
    assert consumer.calls[-4:] == [("unassign", 0), ("unassign", 1),
                                   ("assign at", 2810), ("assign at", 77)]


def test_with_the_fetch_watch_off_a_refused_seek_is_only_retried() -> None:
    consumer = ScriptedConsumer(refuse_seeks=1_000_000)
    loop, _, partition = make_loop(consumer, TXSTAGE_FETCH_STALL_S="0")
    positioned(loop, partition, 2810)
    for now in (1.0, 100.0, 1000.0):
        loop.tick(now)
    assert ("unassign", 0) not in consumer.calls
    assert partition.seek.seek_to == 2810


def test_a_seek_that_lands_late_resets_the_refusal_clock() -> None:
    consumer = ScriptedConsumer(refuse_seeks=2)
    loop, _, partition = make_loop(consumer, TXSTAGE_FETCH_STALL_S="10")
    positioned(loop, partition, 2810)   # refused
    loop.tick(1.0)                      # refused, since 1.0
    loop.tick(2.0)                      # lands
    consumer.refuse_seeks = 1_000_000
    loop.positions.seek(partition, 3000)         # sought again (a rewind, a fetch restart): refused
    loop.tick(12.0)                     # the clock starts here, not at 1.0
    loop.tick(21.0)
    assert ("unassign", 0) not in consumer.calls
    loop.tick(22.0)
    assert ("assign at", 3000) in consumer.calls


def test_records_fetched_before_a_seek_are_not_processed_after_it() -> None:
    # The position lookup ends beside the loop; its Positioned is dispatched after the
    # next consume() returned, so that batch holds records of the fetch the seek
    # replaced: beyond the position, they are not its continuation.
    consumer = ScriptedConsumer(batches=[batch(4283, 4290), batch(2810, 2815)])
    loop, committer, partition = make_loop(consumer)
    lookup = threading.Event()
    loop.jobs.start(partition, lambda: (lookup.set(), sm.Positioned(2810, 0.0))[1])
    assert lookup.wait(5)
    time.sleep(0.1)  # the job's completion is queued
    loop.iterate()   # consume() (the stale batch), then the lookup's answer: the seek
    assert consumer.calls[:1] == [("seek", 2810)]
    assert committer.written == []
    loop.iterate()
    assert committer.written == list(range(2810, 2816))


def test_a_first_record_beyond_the_committed_offset_is_sought_again() -> None:
    consumer = ScriptedConsumer(batches=[batch(4283, 4290), batch(2810, 2812)])
    loop, committer, partition = make_loop(consumer)
    positioned(loop, partition, 2810)
    loop.iterate()   # the fetcher started far ahead: seek again, process nothing
    assert committer.written == []
    assert consumer.calls.count(("seek", 2810)) == 2
    loop.iterate()   # from where Kafka committed, this time
    assert committer.written == [2810, 2811, 2812]


def test_a_gap_that_persists_after_seeking_again_is_accepted() -> None:
    # Transactional input: the committed offset is often a commit marker's.
    consumer = ScriptedConsumer(batches=[batch(2811, 2813), batch(2811, 2813)])
    loop, committer, partition = make_loop(consumer)
    positioned(loop, partition, 2810)
    loop.iterate()
    loop.iterate()
    assert committer.written == [2811, 2812, 2813]
    assert consumer.calls.count(("seek", 2810)) == 2


def test_with_nothing_committed_and_reset_latest_the_log_end_is_where_it_starts() -> None:
    # The old loop read auto.offset.reset from the settings' masked value (never
    # "latest") and sought the beginning; and had it sought the end, the first record
    # fetched there was checked against position 0 and sought again: to offset 0.
    consumer = ScriptedConsumer(batches=[batch(4283, 4285), batch(4286, 4287)])
    loop, committer, partition = make_loop(consumer, TXSTAGE_CONSUMER__AUTO_OFFSET_RESET="latest")
    positioned(loop, partition, -1001)  # OFFSET_INVALID: nothing committed
    assert consumer.calls[0] == ("seek", OFFSET_END)
    loop.iterate()
    loop.iterate()
    assert committer.written == [4283, 4284, 4285, 4286, 4287]
    assert [call for call in consumer.calls if call[0] == "seek"] == [("seek", OFFSET_END)]


def test_from_the_end_with_nothing_committed_a_repositioning_goes_back_to_the_start() -> None:
    # An abort or a poison retry before the first commit: Kafka still has nothing
    # committed, and sought to the end again the partition would skip what it had
    # read and not committed (loss).
    consumer = ScriptedConsumer(batches=[batch(4283, 4285), [], batch(4283, 4286)])
    loop, committer, partition = make_loop(consumer, TXSTAGE_CONSUMER__AUTO_OFFSET_RESET="latest")
    positioned(loop, partition, -1001)
    loop.iterate()
    assert committer.written == [4283, 4284, 4285]
    partition.state = sm.PartitionState(sm.Phase.POSITIONING)  # aborted: look up again
    positioned(loop, partition, -1001)
    assert [call for call in consumer.calls if call[0] == "seek"] == [
        ("seek", OFFSET_END), ("seek", 4283)]
    loop.iterate()
    loop.iterate()
    assert committer.written == [4283, 4284, 4285, 4283, 4284, 4285, 4286]


def test_the_lag_of_a_partition_read_to_a_commit_marker_is_zero() -> None:
    # Transactional input: the position (last record + 1) is the commit marker's
    # offset and the high watermark one past it. The fetcher's end of partition says
    # it read everything; the gauge read 1 for good, and TxstageNoCommitsWhileLagging
    # fired on an idle stage.
    consumer = ScriptedConsumer(batches=[batch(2810, 2819)])
    consumer.high = 2821
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 2810)
    loop.iterate()
    assert partition.position == 2820
    loop.housekeeper.due_at = 0.0
    loop.tick(1.0)
    lag = loop.metrics.consumer_lag.labels(TOPIC, "0")
    assert lag._value.get() == 1  # no end reported: one offset not yet read, as far as known
    end = Message(topic=TOPIC, partition=0, offset=2821,
                  error=KafkaError(KafkaError._PARTITION_EOF))
    consumer.batches.append([end])
    loop.iterate()
    loop.housekeeper.due_at = 0.0
    loop.tick(2.0)
    assert lag._value.get() == 0
    consumer.batches.append(batch(2821, 2822))  # more input: read from the position again
    consumer.high = 2824
    loop.iterate()
    loop.housekeeper.due_at = 0.0
    loop.tick(3.0)
    assert lag._value.get() == 1


def test_with_nothing_committed_and_reset_earliest_the_first_record_is_still_checked() -> None:
    # The fetcher may start at librdkafka's stale application position; from the
    # beginning, 0 is a bound it must not be beyond (retention: it is sought again
    # once, then the gap is accepted).
    consumer = ScriptedConsumer(batches=[batch(4283, 4285), batch(100, 101)])
    loop, committer, partition = make_loop(consumer)
    positioned(loop, partition, -1001)
    assert consumer.calls[0] == ("seek", OFFSET_BEGINNING)
    loop.iterate()
    assert committer.written == []
    assert consumer.calls[-1] == ("seek", 0)
    loop.iterate()
    assert committer.written == [100, 101]


def test_flowing_records_are_written_unnamed_and_records_under_isolation_named() -> None:
    # A callback object per record only to name it in a failure report cost the hot
    # path; a refusal nobody names is bisected, and bisected records are named.
    consumer = ScriptedConsumer(batches=[batch(2810, 2812), batch(2813, 2815)])
    loop, committer, partition = make_loop(consumer)
    positioned(loop, partition, 2810)
    loop.iterate()
    assert committer.written == [2810, 2811, 2812]
    assert committer.named == [2810]  # the first after positioning is checked on its own
    partition.state = replace(partition.state, isolation=sm.Isolation(2816, 3, 100))
    loop.iterate()
    assert committer.named == [2810, 2813, 2814, 2815]


def _position_reads(after_commit: bool) -> list[bool]:
    """The require_stable of each committed-offset read of one position lookup whose
    first (stable) read times out."""
    reads: list[bool] = []

    def committed_offset(group: str, topic: str, number: int, *, require_stable: bool,
                         timeout_s: float) -> int:
        reads.append(require_stable)
        if len(reads) == 1:
            raise RetriableError(Where("committed", topic, number),
                                 KafkaError(KafkaError._TIMED_OUT, "no answer"))
        return 2810

    loop, _, partition = make_loop(ScriptedConsumer())
    cluster = SimpleNamespace(committed_offset=committed_offset)
    event = loop.positions.lookup(partition, cluster, None, after_commit)()  # type: ignore[arg-type]
    assert isinstance(event, sm.Positioned) and event.offset == 2810
    return reads


def test_after_its_own_commit_a_partition_reads_its_position_stable_only() -> None:
    # commit_transaction returns before the markers that apply its offsets are
    # written; a plain read then may give the offset before the commit, and the poison
    # retry would process those records again (exactly-once broken). After an init or
    # an abort a plain read is as right, and it answers when a stable one times out.
    assert _position_reads(after_commit=True) == [True, True]
    assert _position_reads(after_commit=False) == [True, False]
