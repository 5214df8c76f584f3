"""The watch for partitions librdkafka leaves unfetched (service/stage/fetch_watch.py):
its bookkeeping as tables, then the loop acting on it with a scripted consumer."""

from __future__ import annotations

import time
from types import SimpleNamespace

from service.stage import state as sm
from service.stage.fetch_watch import MAX_WAIT_S, FetchWatch
from tests.unit.test_positioning import ScriptedConsumer, make_loop, positioned

P0, P1 = ("in", 0), ("in", 1)


def watch_with(short_batches: int = 10) -> FetchWatch:
    watch = FetchWatch(stall_after_s=30.0)
    watch.short_batches = short_batches
    return watch


def test_a_partition_is_idle_once_its_position_stays_put_for_the_wait() -> None:
    watch = watch_with()
    assert watch.idle([(P0, 50)], now=0.0) == {}
    watch.short_batches += 2
    assert watch.idle([(P0, 50)], now=29.9) == {}
    assert watch.idle([(P0, 50)], now=30.0) == {P0: 50}


def test_a_moving_position_starts_the_wait_again() -> None:
    watch = watch_with()
    watch.idle([(P0, 50)], now=0.0)
    watch.short_batches += 2
    assert watch.idle([(P0, 51)], now=30.0) == {}
    assert watch.idle([(P0, 51)], now=59.9) == {}
    assert watch.idle([(P0, 51)], now=60.0) == {}  # no short batch since it moved
    watch.short_batches += 2
    assert watch.idle([(P0, 51)], now=60.0) == {P0: 51}


def test_full_batches_mean_its_records_may_be_queued_behind_others() -> None:
    # A slow transform: every consume() returns a full batch, so a partition can wait
    # minutes for its turn with its records already fetched.
    watch = watch_with()
    watch.idle([(P0, 50)], now=0.0)
    watch.short_batches += 1
    assert watch.idle([(P0, 50)], now=300.0) == {}
    watch.short_batches += 1
    assert watch.idle([(P0, 50)], now=301.0) == {P0: 50}


def test_a_partition_that_stops_being_fetchable_is_forgotten() -> None:
    # Paused, committing, seeking: its wait starts again when it is back.
    watch = watch_with()
    watch.idle([(P0, 50), (P1, 7)], now=0.0)
    watch.short_batches += 2
    assert watch.idle([(P1, 7)], now=10.0) == {}
    assert watch.idle([(P0, 50), (P1, 7)], now=30.0) == {P1: 7}
    assert watch.idle([(P0, 50), (P1, 7)], now=40.0) == {P1: 7}
    watch.short_batches += 2
    assert watch.idle([(P0, 50), (P1, 7)], now=40.0) == {P1: 7}  # P0 since 30.0


def test_stalled_means_committed_records_past_the_position() -> None:
    watch = watch_with()
    watch.idle([(P0, 50), (P1, 7)], now=0.0)
    watch.short_batches += 2
    asked = watch.idle([(P0, 50), (P1, 7)], now=30.0)
    # P0: at the last stable offset (the end of its committed input); P1: behind it.
    assert watch.stalled(asked, {P0: (0, 50), P1: (0, 9)}, now=31.0) == [P1]


def test_records_below_the_log_start_are_gone_not_waiting() -> None:
    # Nothing committed, read from the beginning: position 0, retention deleted
    # everything below 40, and 40 is the end: nothing to fetch.
    watch = watch_with()
    watch.idle([(P0, 0)], now=0.0)
    watch.short_batches += 2
    asked = watch.idle([(P0, 0)], now=30.0)
    assert watch.stalled(asked, {P0: (40, 40)}, now=31.0) == []
    assert watch.stalled(asked, {P0: (40, 41)}, now=31.0) == [P0]


def test_a_partition_that_moved_while_kafka_was_asked_is_not_stalled() -> None:
    watch = watch_with()
    watch.idle([(P0, 50)], now=0.0)
    watch.short_batches += 2
    asked = watch.idle([(P0, 50)], now=30.0)
    watch.idle([(P0, 60)], now=30.5)
    assert watch.stalled(asked, {P0: (0, 90)}, now=31.0) == []


def test_each_answer_restarts_the_wait_and_a_stall_doubles_it_up_to_an_hour() -> None:
    watch = watch_with()
    watch.idle([(P0, 50)], now=0.0)
    now, waits = 0.0, []
    for _ in range(10):
        watch.short_batches += 2
        wait = next(s for s in range(1, 10_000) if watch.idle([(P0, 50)], now=now + s))
        waits.append(wait)
        now += wait
        assert watch.stalled({P0: 50}, {P0: (0, 90)}, now=now) == [P0]
    assert waits[:5] == [30, 60, 120, 240, 480]
    assert waits[-1] == MAX_WAIT_S
    # An idle partition at the end of its input is asked about once per wait.
    at_end = watch_with()
    at_end.idle([(P1, 7)], now=0.0)
    at_end.short_batches += 2
    asked = at_end.idle([(P1, 7)], now=30.0)
    assert at_end.stalled(asked, {P1: (0, 7)}, now=30.0) == []
    at_end.short_batches += 2
    assert at_end.idle([(P1, 7)], now=59.0) == {}
    assert at_end.idle([(P1, 7)], now=60.0) == {P1: 7}


def test_the_loop_restarts_the_fetcher_of_a_stalled_partition_at_its_position() -> None:
    consumer = ScriptedConsumer()
    loop, _, partition = make_loop(consumer, TXSTAGE_FETCH_STALL_S="30")
    asked: list[list[tuple[str, int]]] = []

    def log_offsets(keys: list[tuple[str, int]], timeout_s: float) -> dict[
            tuple[str, int], tuple[int, int]]:
        asked.append(keys)
        return {key: (0, 4000) for key in keys}

    loop.limits = SimpleNamespace(lookup=loop.limits.lookup,  # type: ignore[assignment]
                                  cluster=SimpleNamespace(log_offsets=log_offsets))
    positioned(loop, partition, 2810)
    assert partition.state.phase is sm.Phase.ACTIVE
    for _ in range(3):
        loop.iterate()  # empty batches: librdkafka's queue is dry
    start = time.monotonic()
    consumer.calls.clear()
    loop.tick(start + 1)
    loop.tick(start + 31)   # idle for the wait: Kafka is asked beside the loop
    assert loop._fetch_check is not None
    loop._fetch_check[1].result(5)
    loop.tick(start + 32)   # Kafka holds records up to 4000: restart the fetcher
    assert asked == [[("in", 0)]]
    assert consumer.calls == [("pause", 0), ("resume", 0), ("seek", 2810)]
    assert partition.check_first and partition.position == 2810
    assert loop.metrics.fetch_stalls._value.get() == 1


def test_a_partition_at_the_end_of_a_log_it_started_at_is_not_watched() -> None:
    # Nothing committed, auto.offset.reset=latest: its position is not known before its
    # first record, so there is nothing to compare Kafka's answer with.
    consumer = ScriptedConsumer()
    loop, _, partition = make_loop(consumer, TXSTAGE_CONSUMER__AUTO_OFFSET_RESET="latest")
    positioned(loop, partition, -1001)
    assert not loop._should_fetch(partition)
    partition.position = 4001  # its first record arrived
    assert loop._should_fetch(partition)


def test_a_paused_or_holding_partition_is_not_watched() -> None:
    consumer = ScriptedConsumer()
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 2810)
    assert loop._should_fetch(partition)
    partition.state = partition.state.__class__(sm.Phase.ACTIVE,
                                                pauses=frozenset({sm.Pause.BACKOFF}))
    assert not loop._should_fetch(partition)
    partition.state = sm.PartitionState(sm.Phase.COMMITTING)
    assert not loop._should_fetch(partition)
