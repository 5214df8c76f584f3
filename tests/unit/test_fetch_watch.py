"""The watch for partitions librdkafka leaves unfetched (service/stage/fetch_watch.py):
its bookkeeping as tables, then the loop acting on it with a scripted consumer."""

from __future__ import annotations

import time
from types import SimpleNamespace

from service.stage import machine as sm
from service.stage.fetch_watch import CONFIRM_S, MAX_WAIT_S, FetchWatch
from service.stage.housekeeping import should_fetch
from tests.unit.fakes import ScriptedConsumer, make_loop, positioned

P0, P1 = ("in", 0), ("in", 1)


def watch_with(short_batches: int = 10) -> FetchWatch:
    watch = FetchWatch(stall_after_s=30.0)
    watch.short_batches = short_batches
    return watch


def at(*positions: tuple[tuple[str, int], int]) -> list[tuple[tuple[str, int], int, bool]]:
    """Partitions that should be fetching, at these positions."""
    return [(key, position, True) for key, position in positions]


def asked_twice(watch: FetchWatch, key: tuple[str, int], position: int, now: float,
                high: int, fetched: tuple[int, int]) -> tuple[list[object], float]:
    """Kafka asked about an idle partition (its high watermark ``high``), then, a
    suspect or not, asked again once due: the stalled partitions of each answer (the
    high watermarks librdkafka had from fetch responses then: ``fetched``), and when
    the second came."""
    watch.short_batches += 2
    first = watch.stalled(watch.idle(at((key, position)), now), {key: high},
                          {key: fetched[0]}, now)
    watch.short_batches += 2
    confirm = next(now + s / 10 for s in range(1, 100_000)
                   if watch.idle(at((key, position)), now + s / 10))
    second = watch.stalled({key: position}, {key: high}, {key: fetched[1]}, confirm)
    return [first, second], confirm


def test_a_partition_is_idle_once_its_position_stays_put_for_the_wait() -> None:
    watch = watch_with()
    assert watch.idle(at((P0, 50)), now=0.0) == {}
    watch.short_batches += 2
    assert watch.idle(at((P0, 50)), now=29.9) == {}
    assert watch.idle(at((P0, 50)), now=30.0) == {P0: 50}


def test_a_moving_position_starts_the_wait_again() -> None:
    watch = watch_with()
    watch.idle(at((P0, 50)), now=0.0)
    watch.short_batches += 2
    assert watch.idle(at((P0, 51)), now=30.0) == {}
    assert watch.idle(at((P0, 51)), now=59.9) == {}
    assert watch.idle(at((P0, 51)), now=60.0) == {}  # no short batch since it moved
    watch.short_batches += 2
    assert watch.idle(at((P0, 51)), now=60.0) == {P0: 51}


def test_full_batches_mean_its_records_may_be_queued_behind_others() -> None:
    # A slow transform: every consume() returns a full batch, so a partition can wait
    # minutes for its turn with its records already fetched.
    watch = watch_with()
    watch.idle(at((P0, 50)), now=0.0)
    watch.short_batches += 1
    assert watch.idle(at((P0, 50)), now=300.0) == {}
    watch.short_batches += 1
    assert watch.idle(at((P0, 50)), now=301.0) == {P0: 50}


def test_a_partition_that_should_not_be_fetching_waits_again_and_a_gone_one_is_forgotten(
) -> None:
    watch = watch_with()
    watch.idle(at((P0, 50), (P1, 7)), now=0.0)
    watch.short_batches += 2
    assert watch.idle([(P0, 50, False), (P1, 7, True)], now=10.0) == {}  # P0 paused
    assert watch.idle(at((P0, 50), (P1, 7)), now=30.0) == {P1: 7}
    assert watch.idle(at((P0, 50), (P1, 7)), now=39.9) == {P1: 7}
    watch.short_batches += 2
    assert watch.idle(at((P0, 50), (P1, 7)), now=40.0) == {P0: 50, P1: 7}
    watch.idle(at((P1, 7)), now=41.0)  # P0 released
    watch.short_batches += 2
    assert watch.idle(at((P0, 50), (P1, 7)), now=70.0) == {P1: 7}  # P0 anew


def test_stalled_means_no_fetch_response_showed_what_kafka_had() -> None:
    # The first answer makes a suspect: the offsets may have been written a moment
    # ago. CONFIRM_S later librdkafka has still not had a fetch response saying so.
    watch = watch_with()
    watch.idle(at((P0, 50)), now=0.0)
    (first, second), confirm = asked_twice(watch, P0, 50, 30.0, high=90, fetched=(50, 50))
    assert first == [] and second == [P0]
    assert confirm == 30.0 + CONFIRM_S
    # Never a fetch response since it was assigned: the same.
    watch = watch_with()
    watch.idle(at((P1, 7)), now=0.0)
    (first, second), _ = asked_twice(watch, P1, 7, 30.0, high=7, fetched=(-1, -1))
    assert first == [] and second == [P1]


def test_a_fetch_response_that_caught_up_clears_the_suspect() -> None:
    watch = watch_with()
    watch.idle(at((P0, 50)), now=0.0)
    (first, second), _ = asked_twice(watch, P0, 50, 30.0, high=90, fetched=(50, 90))
    assert first == second == []


def test_a_partition_that_has_read_to_a_commit_marker_is_no_suspect() -> None:
    # Transactional input: the position is the last record's offset + 1, the commit
    # marker's offset; Kafka's high watermark is one past it, and so is the one the
    # fetcher last saw. Offsets past the position say nothing about records.
    watch = watch_with()
    watch.idle(at((P0, 2820)), now=0.0)
    (first, second), confirm = asked_twice(watch, P0, 2820, 30.0, high=2821,
                                           fetched=(2821, 2821))
    assert first == second == []
    assert confirm == 60.0  # no suspect: once per wait


def test_a_partition_that_moved_while_kafka_was_asked_is_not_stalled() -> None:
    watch = watch_with()
    watch.idle(at((P0, 50)), now=0.0)
    watch.short_batches += 2
    asked = watch.idle(at((P0, 50)), now=30.0)
    watch.idle(at((P0, 60)), now=30.5)
    assert watch.stalled(asked, {P0: 90}, {P0: 50}, now=31.0) == []


def test_each_stall_doubles_the_wait_up_to_an_hour() -> None:
    watch = watch_with()
    watch.idle(at((P0, 50)), now=0.0)
    now, waits = 0.0, []
    for _ in range(10):
        watch.short_batches += 2
        wait = next(s for s in range(1, 10_000) if watch.idle(at((P0, 50)), now=now + s))
        waits.append(wait)
        now += wait
        (first, second), now = asked_twice(watch, P0, 50, now, high=90, fetched=(50, 50))
        assert first == [] and second == [P0]
    assert waits[:5] == [30, 60, 120, 240, 480]
    assert waits[-1] == MAX_WAIT_S


def test_the_loop_restarts_the_fetcher_of_a_stalled_partition_at_its_position() -> None:
    consumer = ScriptedConsumer()
    loop, _, partition = make_loop(consumer, TXSTAGE_FETCH_STALL_S="30")
    asked: list[list[tuple[str, int]]] = []

    def high_watermarks(keys: list[tuple[str, int]], timeout_s: float) -> dict[
            tuple[str, int], int]:
        asked.append(keys)
        return {key: 4000 for key in keys}

    loop.limits = SimpleNamespace(lookup=loop.limits.lookup,  # type: ignore[assignment]
                                  cluster=SimpleNamespace(high_watermarks=high_watermarks))
    positioned(loop, partition, 2810)
    assert partition.state.phase is sm.Phase.ACTIVE
    for _ in range(3):
        loop.iterate()  # empty batches: librdkafka's queue is dry
    start = time.monotonic()
    consumer.calls.clear()
    loop.tick(start + 1)
    loop.tick(start + 31)   # idle for the wait: Kafka is asked beside the loop
    assert loop.housekeeper._fetch_check is not None
    loop.housekeeper._fetch_check[1].result(5)
    loop.tick(start + 32)   # Kafka's high watermark 4000, no fetch response: a suspect
    assert consumer.calls == []
    for _ in range(2):
        loop.iterate()      # the queue runs dry again
    consumer.calls.clear()
    loop.tick(start + 37)   # asked again, CONFIRM_S later
    assert loop.housekeeper._fetch_check is not None
    loop.housekeeper._fetch_check[1].result(5)
    loop.tick(start + 38)   # still no fetch response: restart the fetcher
    assert asked == [[("in", 0)], [("in", 0)]]
    assert consumer.calls == [("pause", 0), ("resume", 0), ("seek", 2810)]
    assert partition.seek.check_first and partition.position == 2810
    assert loop.metrics.fetch_stalls._value.get() == 1


def test_a_paused_or_holding_partition_is_not_watched() -> None:
    consumer = ScriptedConsumer()
    loop, _, partition = make_loop(consumer)
    positioned(loop, partition, 2810)
    assert should_fetch(partition)
    partition.state = partition.state.__class__(sm.Phase.ACTIVE,
                                                pauses=frozenset({sm.Pause.BACKOFF}))
    assert not should_fetch(partition)
    partition.state = sm.PartitionState(sm.Phase.COMMITTING)
    assert not should_fetch(partition)
