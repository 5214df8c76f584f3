"""The worker pool without Kafka: real spawned processes, the harness's transforms.

Results come back per partition in input order whatever finishes first; a record that
kills its worker or overruns the time-out is blamed by the worker's shared progress,
and once blamed ``max_record_attempts`` times it is a failure without being run."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from service import Output, Record
from service.contract.processing import process
from service.errors import ConfigError
from service.stage.workers import Chunk, WorkerPool
from service.stage.workers.wire import Replay, WireRecord, failure_of, rebuilt, replay


def records(partition: int, offsets: range) -> list[WireRecord]:
    return [("t", partition, offset, 0, b"k", str(offset).encode(), ()) for offset in offsets]


def run(pool: WorkerPool, expected: int, timeout: float = 20.0) -> list[Chunk]:
    done: list[Chunk] = []
    deadline = time.monotonic() + timeout
    while len(done) < expected:
        assert time.monotonic() < deadline, f"{len(done)} of {expected} chunks back"
        pool.serve(0.1)
        done.extend(pool.completed())
    return done


@pytest.fixture
def started() -> Iterator[list[WorkerPool]]:
    pools: list[WorkerPool] = []
    yield pools
    for pool in pools:
        pool.shutdown()


def pool_of(started: list[WorkerPool], transform: str, **kwargs: float) -> WorkerPool:
    pool = WorkerPool(transform, 2, timeout_s=kwargs.get("timeout_s", 0.0),
                      max_record_attempts=int(kwargs.get("attempts", 2)))
    started.append(pool)
    pool.start()
    return pool


def test_a_partition_gets_its_chunks_back_in_order_behind_a_slow_head(
        started: list[WorkerPool], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_HEAD_S", "0.5")  # read by the workers at each call
    pool = pool_of(started, "tests.harness.transforms:slow_head")
    first = pool.submit(("t", 0), None, 0, [], records(0, range(0, 5)), 0)
    second = pool.submit(("t", 0), None, 0, [], records(0, range(5, 10)), 0)
    other = pool.submit(("t", 1), None, 0, [], records(1, range(0, 5)), 0)
    # The other partition is not held back by partition 0's slow head; 0's second
    # chunk is done but waits for its first.
    assert run(pool, 1, timeout=0.4) == [other]
    assert second.results is not None and first.results is None
    assert run(pool, 2) == [first, second]
    assert [out[0][0][0] for out in first.results or []] == [b"0", b"1", b"4", b"9", b"16"]


def test_a_record_that_ends_its_worker_is_a_failure_once_blamed_enough(
        started: list[WorkerPool], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_EXIT_AT", "3")
    pool = pool_of(started, "tests.harness.transforms:exits_at", attempts=2)
    chunk = pool.submit(("t", 0), None, 0, [], records(0, range(6)), 0)
    [done] = run(pool, 1)
    assert done is chunk and pool.restarts == 2 and pool.alive == 2
    assert chunk.results is not None
    outputs, failure, _ = chunk.results[3]
    assert outputs == [] and failure is not None
    assert failure[1:] == ("TransformCrashedError",
                           "the transform ended its worker process (exit code 70) on 2 attempt(s)")
    assert [result[1] for i, result in enumerate(chunk.results) if i != 3] == [None] * 5


def test_a_call_past_the_time_out_kills_its_worker_and_is_blamed(
        started: list[WorkerPool], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_HANG_AT", "2")
    pool = pool_of(started, "tests.harness.transforms:hangs_at", timeout_s=0.5, attempts=1)
    started_at = time.monotonic()
    chunk = pool.submit(("t", 0), None, 0, [], records(0, range(4)), 0)
    run(pool, 1)
    assert time.monotonic() - started_at < 5
    assert pool.timeouts == 1
    assert chunk.results is not None and chunk.results[2][1] is not None
    assert chunk.results[2][1][1] == "TransformTimeoutError"


def test_discarded_chunks_never_come_back(started: list[WorkerPool]) -> None:
    pool = pool_of(started, "service.examples.square:square")
    pool.submit(("t", 0), None, 0, [], records(0, range(5)), 0)
    kept = pool.submit(("t", 1), None, 0, [], records(1, range(5)), 0)
    assert len(pool.discard(("t", 0))) == 1
    assert run(pool, 1) == [kept]
    pool.serve(0.3)
    assert list(pool.completed()) == [] and pool.in_flight == 0


def test_a_transform_that_cannot_be_imported_in_a_worker_is_a_config_error(
        started: list[WorkerPool]) -> None:
    pool = WorkerPool("no_such_module:f", 1, timeout_s=0, max_record_attempts=1)
    started.append(pool)
    with pytest.raises(ConfigError, match="in a worker process: TXSTAGE_TRANSFORM="):
        pool.start()


def test_a_replayed_failure_is_dead_lettered_as_the_original_would_be() -> None:
    def fails(record: Record) -> Iterator[Output]:
        yield Output(b"first")
        raise KeyError("missing")

    record = Record("t", 0, 7, 0, b"k", b"v")
    try:
        list(fails(record))
    except KeyError as exc:
        failure = failure_of(exc)
    again = rebuilt(failure)
    assert type(again).__qualname__ == "KeyError" and str(again) == "'missing'"
    direct = process(fails, record, default_topic="out", dlq_topic="dlq",
                     max_bytes=lambda topic: 1_000_000)
    replayed = process(lambda _: replay(([(b"first", None, None, ())], failure, 0.0)), record,
                       default_topic="out", dlq_topic="dlq", max_bytes=lambda topic: 1_000_000)
    assert replayed.outputs == direct.outputs  # the dead letter, byte for byte
    assert isinstance(replay(([], None, 0.0)), Replay)


def test_the_worker_environment_is_the_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    # Spawned workers inherit the environment: transforms configured by variables
    # (the harness's TEST_* ones) see the same values.
    monkeypatch.setenv("TEST_EXIT_AT", "1")
    assert os.environ["TEST_EXIT_AT"] == "1"
