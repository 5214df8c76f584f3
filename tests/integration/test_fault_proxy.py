"""The fault proxy bites: faults injected between real clients and a real
broker reach the client, and exactly-once holds through them.

Clients under test bootstrap through the proxy (``proxied_kafka.bootstrap``); topics,
verification and committed offsets go past it (``proxied_kafka.direct_bootstrap``).

The last test is a regression test of a defect the proxy found: one partition's slow abort
must not stall the others. ``TXSTAGE_TEST_STAGE_TREE=/path/to/other/tree`` runs the
replicas from another source tree (see tests/harness/stage.py), which is how it
was shown to fail on the stage before the rebuild.

Takes ≈ 140 s (2 cores; make test, 2026-11-28).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.harness.admin import create_topic
from tests.harness.kafka import ProxiedKafka
from tests.harness.proxy import Api, Applied, FaultKind
from tests.harness.reading import read_committed, read_uncommitted
from tests.harness.stage import (
    GROUP_PROTOCOLS,
    PARTITIONS,
    Replica,
    StageSetup,
    build_stage,
    one_protocol,
    produce_inputs,
    wait_for,
)
from tests.harness.stage import value as metric_value
from tests.harness.transforms import square_unless_refused_on_some_partitions

pytestmark = pytest.mark.kafka

UniqueName = Callable[[str], str]


class _Records(logging.Handler):
    """librdkafka's log lines (the ``logger`` client property), kept for assertions."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _client_log(name: str) -> tuple[logging.Logger, _Records]:
    logger = logging.getLogger(f"tests.rdkafka.{name}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    records = _Records()
    logger.addHandler(records)
    return logger, records


@contextlib.contextmanager
def _closing(*producers: Producer) -> Iterator[None]:
    """Close the producers however the test ends (no reconnect noise after it)."""
    try:
        yield
    finally:
        for producer in producers:
            with contextlib.suppress(Exception):
                producer.close()


def _timed(call: Callable[[], object]) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


# ----------------------------------------------------------------- (a) delayed EndTxn


def test_a_delayed_end_txn_response_holds_commit_transaction(
        proxied_kafka: ProxiedKafka, unique_name: UniqueName) -> None:
    delay = 3.0
    topic = create_topic(proxied_kafka.direct_bootstrap, unique_name("endtxn"))
    slow_id, other_id = unique_name("tx-slow"), unique_name("tx-other")
    slow = Producer({"bootstrap.servers": proxied_kafka.bootstrap, "transactional.id": slow_id})
    other = Producer({"bootstrap.servers": proxied_kafka.bootstrap,
                      "transactional.id": other_id})
    with _closing(slow, other):
        _delayed_end_txn(proxied_kafka, topic, slow, slow_id, other, delay)


def _delayed_end_txn(proxied_kafka: ProxiedKafka, topic: str, slow: Producer, slow_id: str,
                     other: Producer, delay: float) -> None:
    proxy = proxied_kafka.proxy
    for producer in (slow, other):
        producer.init_transactions(30)
    assert proxy.seen(Api.INIT_PRODUCER_ID, slow_id) >= 1, \
        "the producer must talk to the broker through the proxy\n" + proxy.describe()

    def commit(producer: Producer, value: bytes) -> None:
        producer.begin_transaction()
        producer.produce(topic, value)
        producer.commit_transaction(60)

    before = _timed(lambda: commit(slow, b"before"))
    fault = proxy.delay_response(Api.END_TXN, delay, transactional_id=slow_id, count=1)
    held: list[float] = []
    committing = threading.Thread(target=lambda: held.append(_timed(
        lambda: commit(slow, b"delayed"))))
    committing.start()
    # While the slow producer's EndTxn response is held, another transactional id's
    # commit is not: the fault selects by transactional id.
    proxy.wait_applied(fault, 1, timeout=10)
    alongside = _timed(lambda: commit(other, b"alongside"))
    assert committing.is_alive(), "the delayed commit returned before its response came"
    committing.join(60)
    after = _timed(lambda: commit(slow, b"after"))  # count=1: no longer delayed

    [applied] = proxy.applied_to(fault)
    assert (applied.kind, applied.api_key, applied.transactional_id, applied.commit) == \
        (FaultKind.DELAY_RESPONSE, Api.END_TXN, slow_id, True), str(applied)
    assert applied.delivered and applied.held_s is not None and applied.held_s >= delay - 0.05
    assert held and held[0] >= delay, f"commit_transaction took {held}, delay {delay} s"
    assert max(before, alongside, after) < delay / 2, (before, alongside, after)
    values = [r.value for r in read_committed(proxied_kafka.direct_bootstrap, topic)]
    assert sorted(values) == sorted([b"before", b"delayed", b"alongside", b"after"])  # type: ignore[type-var]


# --------------------------------------------------------- (b) dropped mid-Produce


def test_b_dropped_connections_mid_produce_are_seen_and_exactly_once_holds(
        proxied_kafka: ProxiedKafka, unique_name: UniqueName) -> None:
    # Each transaction's first Produce loses its connection: on even transactions after
    # the broker appended the batch (the response is lost, the client resends the same
    # sequence numbers and the broker must answer from its dedupe window), on odd ones
    # before the broker saw it. A third of the transactions are then aborted.
    topic = create_topic(proxied_kafka.direct_bootstrap, unique_name("drops"), partitions=2)
    tid = unique_name("tx-drops")
    logger, client_log = _client_log(tid)
    client_errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": proxied_kafka.bootstrap, "transactional.id": tid,
                         "linger.ms": 5, "logger": logger, "error_cb": client_errors.append})
    with _closing(producer):
        _transactions_with_drops(proxied_kafka, topic, producer, tid, client_log)
    print(f"client errors: {client_errors}")


def _transactions_with_drops(proxied_kafka: ProxiedKafka, topic: str, producer: Producer,
                             tid: str, client_log: _Records) -> None:
    proxy, direct = proxied_kafka.proxy, proxied_kafka.direct_bootstrap
    producer.init_transactions(30)
    transactions, per_transaction = 9, 200
    committed: list[bytes] = []
    drops = []
    for t in range(transactions):
        fault = proxy.drop_connection(Api.PRODUCE, on="response" if t % 2 == 0 else "request",
                                      transactional_id=tid, count=1)
        drops.append(fault)
        producer.begin_transaction()
        values = [f"{t}-{i}".encode() for i in range(per_transaction)]
        for i, value in enumerate(values):
            producer.produce(topic, value, partition=i % 2)
        assert producer.flush(60) == 0, f"transaction {t}: outputs not delivered"
        proxy.wait_applied(fault, 1, timeout=1)  # flush returned: it was applied
        if t % 3 == 2:
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
            committed.extend(values)

    applied = [a for fault in drops for a in proxy.applied_to(fault)]
    assert len(applied) == transactions, proxy.describe()
    assert {a.api_key for a in applied} == {Api.PRODUCE}
    assert {a.transactional_id for a in applied} == {tid}
    # The client saw every drop: librdkafka logs each lost connection ("Disconnected")
    # and retried; nothing was lost or written twice.
    wait_for(lambda: sum("Disconnected" in line for line in client_log.lines) >= transactions,
             10, f"{transactions} disconnects in the client's log",
             lambda: "\n".join(client_log.lines))
    visible = [r.value for r in read_committed(direct, topic)]
    assert len(visible) == len(set(visible)), "duplicates visible read_committed"
    assert sorted(v for v in visible if v is not None) == sorted(committed)
    everything = [r.value for r in read_uncommitted(direct, topic)]
    assert len(everything) == len(set(everything)), \
        "a resent batch was appended twice: the broker did not deduplicate it"
    assert len(everything) == transactions * per_transaction


# ---------------------------------------------- (c) a slow abort stalls nobody


@dataclass(frozen=True)
class Sample:
    at: float
    committed: dict[int, int]  # partition -> committed offset (-1001: none yet)
    health: int | None  # /healthz status, None while not serving


class Monitor:
    """Samples the group's committed offsets (past the proxy) and the replica's
    /healthz every ``interval`` seconds, in a thread, while the block runs."""

    def __init__(self, bootstrap: str, group_id: str, topic: str, replica: Replica,
                 interval: float = 0.25) -> None:
        self.samples: list[Sample] = []
        self.error: BaseException | None = None
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                                   "enable.auto.commit": False})
        self._partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self._replica, self._interval = replica, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._consumer.close()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                offsets = self._consumer.committed(self._partitions, timeout=10)
                try:
                    health: int | None = self._replica.get("/healthz")[0]
                except OSError:
                    health = None
                self.samples.append(Sample(time.monotonic(),
                                           {tp.partition: tp.offset for tp in offsets}, health))
        except BaseException as exc:
            self.error = exc

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at <= end]


def _feed(bootstrap: str, topic: str, count: int, seconds: float, stop: threading.Event,
          errors: list[BaseException]) -> None:
    """``str(i)``, key ``k<i>``, round-robin over the partitions, spread over ``seconds``;
    ``stop`` ends it early (what was produced is flushed)."""
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "linger.ms": 5})
        started = time.monotonic()
        for i in range(count):
            producer.produce(topic, str(i).encode(), f"k{i}".encode(), partition=i % PARTITIONS)
            producer.poll(0)
            pause = started + seconds * (i + 1) / count - time.monotonic()
            if stop.wait(max(pause, 0)):
                break
        assert producer.flush(30) == 0, "inputs not delivered"
    except BaseException as exc:
        errors.append(exc)


def _stalls(windows: list[Applied], monitor: Monitor) -> list[str]:
    """What went wrong while partition 0's aborts were held: another partition that
    committed nothing inside a window, or /healthz not 200 at any time."""
    problems = []
    for window in windows:
        assert window.released_at is not None
        inside = monitor.between(window.at + 0.5, window.released_at - 0.5)
        if len(inside) < 2:
            problems.append(f"{window}: only {len(inside)} samples inside")
            continue
        first, last = inside[0], inside[-1]
        stalled = [p for p in range(1, PARTITIONS) if last.committed[p] <= first.committed[p]]
        if stalled:
            problems.append(
                f"{window}: partitions {stalled} committed nothing during "
                f"{last.at - first.at:.1f} s (offsets {first.committed} -> {last.committed})")
        unhealthy = [s for s in inside if s.health != 200]
        if unhealthy:
            problems.append(f"{window}: /healthz {[s.health for s in unhealthy]} "
                            f"in {len(unhealthy)} of {len(inside)} samples")
    not_ok = [s.health for s in monitor.samples if s.health not in (None, 200)]
    if not_ok:
        problems.append(f"/healthz answered {sorted(set(not_ok))} ({len(not_ok)} of "
                        f"{len(monitor.samples)} samples) while partition 0 was held")
    return problems


@pytest.fixture(params=GROUP_PROTOCOLS)
def proxied_stage(request: pytest.FixtureRequest, proxied_kafka: ProxiedKafka,
                  unique_name: UniqueName, tmp_path: Path) -> Iterator[StageSetup]:
    """The stage fixture's setup on the proxied cluster: topics, verification and
    committed offsets past the proxy; the replicas bootstrap through it."""
    setup = build_stage(proxied_kafka.direct_bootstrap, unique_name, tmp_path, request.param)
    setup.env["TXSTAGE_BOOTSTRAP_SERVERS"] = proxied_kafka.bootstrap
    yield setup
    for replica in setup.started:
        replica.kill()
    print(setup.logs())
    print(proxied_kafka.proxy.describe())


@one_protocol("consumer", "proxied_stage")  # the held EndTxn is the producer's
def test_c_a_slow_abort_of_one_partition_stalls_no_other_partition(
        proxied_stage: StageSetup, proxied_kafka: ProxiedKafka, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 8, defect 3. Partition 0 refuses an output at offsets 42 and 142 (a keyless
    # record to a compacted topic), so its transaction must abort; every EndTxn response
    # of partition 0's transactional id is held 10 s by the proxy. The old stage ran
    # aborts on the loop thread: for those 10 s no partition was processed or committed
    # and /healthz (stale after 3 s) failed. The rebuilt stage aborts beside the loop.
    stage, proxy = proxied_stage, proxied_kafka.proxy
    hold = 10.0
    monkeypatch.setenv("TEST_REFUSING_PARTITIONS", "0")  # also read by the expectation
    compacted = create_topic(stage.bootstrap, unique_name("compact"),
                             config={"cleanup.policy": "compact"})
    slow_id = f"{stage.group_id}.{stage.input_topic}.0"
    fault = proxy.delay_response(Api.END_TXN, hold, transactional_id=slow_id)
    replica = stage.replica(
        "a", TXSTAGE_TRANSFORM="tests.harness.transforms:refused_on_some_partitions",
        TEST_DELAY_MS="3", TEST_REFUSING_PARTITIONS="0", TEST_COMPACTED_TOPIC=compacted,
        TXSTAGE_HEALTH_STALE_AFTER_S="3")
    wait_for(replica.ready, 60, "the replica to be ready", stage.logs)
    # 5 records a second per partition, until both abort windows are over (so the other
    # partitions have work all through them): partition 0 reaches offset 42 after ~8 s.
    stop = threading.Event()
    feed_errors: list[BaseException] = []
    feeder = threading.Thread(target=_feed, args=(stage.bootstrap, stage.input_topic,
                                                  PARTITIONS * 1000, 200.0, stop, feed_errors))

    def aborts() -> list[Applied]:
        return [a for a in proxy.applied_to(fault) if a.commit is False]

    with Monitor(stage.bootstrap, stage.group_id, stage.input_topic, replica) as monitor:
        feeder.start()
        began = time.monotonic()
        try:
            # Two aborts of partition 0 (its refusals at 42 and 142), each held 10 s.
            wait_for(lambda: len([a for a in aborts() if a.released_at is not None]) >= 2
                     or not replica.alive(), 150,
                     "two held EndTxn(abort) responses of partition 0",
                     lambda: stage.logs() + "\n" + proxy.describe())
        finally:
            stop.set()
            feeder.join(60)
    assert monitor.error is None, monitor.error
    assert not feed_errors, feed_errors

    windows = [a for a in aborts() if a.released_at is not None]
    assert windows, "no abort of partition 0 was held\n" + proxy.describe() + stage.logs()
    for window in windows:
        assert window.delivered and (window.held_s or 0) >= hold - 0.1, str(window)
    problems = _stalls(windows, monitor)
    for window in windows:  # shown with -s, and in the report of a failure
        assert window.released_at is not None
        inside = monitor.between(window.at, window.released_at)
        if inside:
            print(f"{window}\n  committed {inside[0].committed}\n  -> {inside[-1].committed}"
                  f"\n  /healthz {sorted({str(s.health) for s in inside})}")
    assert not problems, "\n".join(problems) + "\n" + proxy.describe() + "\n" + stage.logs()

    print(f"two aborts held after {time.monotonic() - began:.1f} s")
    proxy.clear(fault)
    wait_for(lambda: stage.committed() or not replica.alive(), 90,
             "the group's committed offsets to reach the input end", stage.logs)
    assert replica.alive(), f"the replica exited ({replica.proc and replica.proc.poll()})\n" \
        + stage.logs()
    print(f"input committed {time.monotonic() - began:.1f} s after the feed started")
    report = stage.verify(square_unless_refused_on_some_partitions)
    assert report.ok, "\n".join(report.problems()) + "\n" + stage.logs()
    assert report.found == report.expected > 0
    assert [e for e in replica.events("transaction.aborted")
            if e.get("partition") == 0], "partition 0 never aborted\n" + stage.logs()
    stopping = time.monotonic()
    assert replica.terminate() == 0
    print(f"stopped in {time.monotonic() - stopping:.1f} s")


# --------------------------- (d) the stage itself sees a late EndTxn and lost Produces


@one_protocol("classic", "proxied_stage")  # both faults are the producer's
def test_d_the_stage_sees_delayed_end_txn_responses_and_dropped_produce_connections(
        proxied_stage: StageSetup, proxied_kafka: ProxiedKafka) -> None:
    # Tests (a) and (b) show the faults reach a bare client; this one shows they reach
    # the stage: partition 0's commit waits for its held EndTxn response (the commit
    # latency histogram counts it above 2.5 s), and partition 1's producer loses its
    # connection in the middle of Produce (after the broker appended: the resend must be
    # deduplicated), logs each loss and retries, and exactly-once holds.
    stage, proxy = proxied_stage, proxied_kafka.proxy
    delay, drops = 4.0, 3
    slow_id = f"{stage.group_id}.{stage.input_topic}.0"
    dropped_id = f"{stage.group_id}.{stage.input_topic}.1"
    replica = stage.replica("a", TXSTAGE_TRANSFORM="tests.harness.transforms:slow_square",
                            TEST_DELAY_MS="1")
    wait_for(replica.ready, 60, "the replica to be ready", stage.logs)
    held = proxy.delay_response(Api.END_TXN, delay, transactional_id=slow_id, count=1)
    lost = proxy.drop_connection(Api.PRODUCE, on="response", transactional_id=dropped_id,
                                 count=drops)
    produce_inputs(stage.bootstrap, stage.input_topic, range(4_000), PARTITIONS)
    stage.wait_committed(120)
    # The broker acts on a held EndTxn at once (only its response waits): the offsets
    # can be committed while the stage still waits for the answer.
    wait_for(lambda: all(a.released_at is not None for a in proxy.applied_to(held)), 30,
             "the held EndTxn response to be passed on", proxy.describe)

    [applied_hold], applied_drops = proxy.applied_to(held), proxy.applied_to(lost)
    assert applied_hold.delivered and (applied_hold.held_s or 0) >= delay - 0.1, \
        proxy.describe()
    assert len(applied_drops) == drops, proxy.describe()

    def slow_commits() -> float:
        return metric_value(replica, "txstage_transaction_commit_seconds_count") - \
            metric_value(replica, "txstage_transaction_commit_seconds_bucket", le="2.5")
    wait_for(lambda: slow_commits() >= 1, 10, "a commit above 2.5 s in the histogram",
             replica.metrics)
    # librdkafka folds a repeat of the same error into the next line ("1 identical
    # error(s) suppressed"): drops in quick succession log fewer lines than losses.
    disconnects = sum(1 + int(suppressed.group(1)) if suppressed else 1
                      for line in replica.log_lines()
                      if line.get("logger") == "txstage.librdkafka.producer"
                      and "Disconnected" in str(line.get("event"))
                      for suppressed in [re.search(r"(\d+) identical error\(s\) suppressed",
                                                   str(line.get("event")))])
    assert disconnects >= drops, "the producer never logged its lost connections\n" \
        + replica.log_tail(80)
    stage.assert_exactly_once()
    assert replica.terminate() == 0


def test_e_seed_14_at_least_once_commits_again_what_a_failed_offset_commit_left_behind(
        proxied_stage: StageSetup, proxied_kafka: ProxiedKafka) -> None:
    # At-least-once commits offsets asynchronously once their outputs were delivered.
    # The old stage only logged a failed commit (chaos seed 14: ILLEGAL_GENERATION while
    # the group rebalanced): once the input stopped nothing committed those partitions
    # again and the group stayed behind for good. Here every OffsetCommit loses its
    # connection while the last records are processed; once that ends, the stage must
    # commit the whole input without new records to carry it.
    stage, proxy = proxied_stage, proxied_kafka.proxy
    replica = stage.replica("a", TXSTAGE_GUARANTEE="at_least_once",
                            TXSTAGE_TRANSFORM="tests.harness.transforms:slow_square",
                            TEST_DELAY_MS="1")
    wait_for(replica.ready, 60, "the replica to be ready", stage.logs)
    refused = proxy.drop_connection(Api.OFFSET_COMMIT, on="request", duration_s=8.0)
    produce_inputs(stage.bootstrap, stage.input_topic, range(800), PARTITIONS)
    wait_for(lambda: any(line.get("event") == "offsets.commit_failed"
                         for line in replica.log_lines()), 8,
             "an offset commit to fail", replica.log_tail)
    wait_for(lambda: refused.expired(time.monotonic()), 10, "the fault to end",
             proxy.describe)
    stage.wait_committed(30)
    report = stage.verify()
    assert not (report.missing or report.unexpected or report.mismatched), report.problems()
    assert replica.terminate() == 0


# ------------------------------------- (f) a stray TxnOffsetCommit of an aborted transaction


@pytest.mark.parametrize("renewed", [False, True], ids=["same_producer", "renewed_producer"])
def test_f_a_stray_offset_commit_of_an_aborted_transaction(
        proxied_kafka: ProxiedKafka, unique_name: UniqueName, renewed: bool) -> None:
    # librdkafka has no KIP-890 part 2: a TxnOffsetCommit it gave up on (its request
    # timed out, it disconnected and sent it again) can still reach the broker later,
    # here held 5 s by the proxy as a paused broker's socket buffer would. The
    # transaction is then aborted. Under the same producer (same epoch) the stray joins
    # the next transaction and commits the aborted transaction's offsets with it: the
    # group's offset passes inputs whose outputs were aborted (loss). A new producer
    # for the next transaction (init_transactions bumps the epoch), as the stage makes
    # after every abort, gets the stray fenced.
    proxy, direct = proxied_kafka.proxy, proxied_kafka.direct_bootstrap
    topic = create_topic(direct, unique_name("stray"))
    group, tid = unique_name("stray-group"), unique_name("tx-stray")
    config = {"bootstrap.servers": proxied_kafka.bootstrap, "transactional.id": tid,
              "socket.timeout.ms": 2000}  # the request time-out librdkafka gives up after
    consumer = Consumer({"bootstrap.servers": direct, "group.id": group})
    first = Producer(config)
    producers = [first]
    with _closing(*producers), contextlib.closing(consumer):  # type: ignore[type-var]
        first.init_transactions(30)
        metadata = consumer.consumer_group_metadata()

        def offsets(next_offset: int) -> list[TopicPartition]:
            return [TopicPartition(topic, 0, next_offset)]

        first.begin_transaction()
        first.produce(topic, b"aborted")
        held = proxy.delay_request(Api.TXN_OFFSET_COMMIT, 5.0, transactional_id=tid, count=1)
        took = _timed(lambda: first.send_offsets_to_transaction(offsets(100), metadata, 30))
        assert took < 4.5, f"send_offsets_to_transaction waited for the held request ({took} s)"
        first.abort_transaction(30)
        second = first
        if renewed:
            first.close()
            second = Producer(config)
            producers.append(second)
            second.init_transactions(30)
        second.begin_transaction()
        second.produce(topic, b"committed")
        second.send_offsets_to_transaction(offsets(50), metadata, 30)
        [stray] = proxy.wait_applied(held, released=True, timeout=15)
        time.sleep(0.5)  # the broker handles the stray
        second.commit_transaction(30)

    [committed] = Consumer({"bootstrap.servers": direct, "group.id": group,
                            "isolation.level": "read_committed"}).committed(
        [TopicPartition(topic, 0)], timeout=30)
    values = [r.value for r in read_committed(direct, topic)]
    assert values == [b"committed"]
    print(f"renewed={renewed}: committed offset {committed.offset}; stray {stray}")
    assert committed.offset == (50 if renewed else 100), proxy.describe()
