"""A flowing partition's records are written a run at a time (``Guarantee.write_run``):
whatever interrupts a run (a failed write, a poison record, another partition's
record) must leave the partition's transaction holding exactly the records before
it, written before the state machine hears of the interruption.

The loop runs against the scripted consumer of fakes.py and a committer
that records the order of what it is asked to do.
"""

from __future__ import annotations

from confluent_kafka import Message

from service.stage import machine as sm
from service.stage.partition import Partition
from tests.unit.fakes import (
    TOPIC,
    OrderedCommitter,
    batch,
    loop_with,
    message,
)


def test_a_write_failing_inside_a_run_aborts_exactly_the_records_before_it() -> None:
    committer = OrderedCommitter(fail_at=2813)
    loop, partition = loop_with(committer, [batch(2810, 2815)])
    loop.iterate()
    # 2810 is checked on its own (the first after positioning), 2811.. are one run.
    assert committer.calls == [("write", 2810), ("write", 2811), ("write", 2812),
                               ("abort", 2813)]
    txn, = committer.txns
    assert (txn.first, txn.next, txn.records) == (2810, 2813, 3)
    assert partition.state.phase is sm.Phase.ABORTING
    assert partition.position == 2813


def test_a_poison_record_inside_a_run_commits_the_records_before_it_first() -> None:
    # The poison record's prefix is committed (machine.faults.poisoned): it must hold the run's
    # records up to the poison one, all written before the commit starts.
    poisoned = Message(topic=TOPIC, partition=0, offset=2813, key=b"k", value=b"not a number",
                       headers=None, error=None, timestamp=message(2813).timestamp())
    committer = OrderedCommitter()
    loop, partition = loop_with(committer, [[*batch(2810, 2812), poisoned,
                                             *batch(2814, 2815)]])
    loop.iterate()
    assert committer.calls == [("write", 2810), ("write", 2811), ("write", 2812),
                               ("commit", 2813)]
    txn, = committer.txns
    assert (txn.first, txn.next, txn.records) == (2810, 2813, 3)
    assert partition.state.phase is sm.Phase.COMMITTING


def test_runs_of_two_partitions_interleaved_in_a_batch_keep_each_its_own_transaction() -> None:
    committer = OrderedCommitter()
    loop, first = loop_with(committer, [])
    second = Partition(TOPIC, 1)
    second.state, second.position = first.state, 0
    second.seek.check_first = False
    loop.partitions[second.key] = second
    second.refresh_flowing()
    other = [Message(topic=TOPIC, partition=1, offset=o, key=b"k", value=b"2",
                     headers=None, error=None, timestamp=(1, 1_700_000_000_000))
             for o in (0, 1)]
    loop.consumer.batches.append(  # type: ignore[attr-defined]
        [*batch(2810, 2812), other[0], *batch(2813, 2814), other[1]])
    loop.iterate()
    assert first.position == 2815 and second.position == 2
    assert first.state.txn is not None and second.state.txn is not None
    assert (first.state.txn.first, first.state.txn.next, first.state.txn.records) == \
        (2810, 2815, 5)
    assert (second.state.txn.first, second.state.txn.next, second.state.txn.records) == (0, 2, 2)
