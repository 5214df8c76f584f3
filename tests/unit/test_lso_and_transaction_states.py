"""The stuck-LSO tracker and the producers' transaction-state collector: pure parts of
service/observability/lso_watch.py and service/observability/txn_states.py."""

import json

from service.observability.lso_watch import LsoTracker
from service.observability.txn_states import TransactionStates

KEY = ("output", "out", 1)


def test_an_lso_at_the_high_watermark_is_never_stuck() -> None:
    tracker = LsoTracker()
    assert tracker.observe(KEY, 10, 10, now=0.0) == (0, 0.0)
    assert tracker.observe(KEY, 20, 20, now=50.0) == (0, 0.0)


def test_an_lso_that_stays_below_the_high_watermark_is_stuck_since_first_seen() -> None:
    tracker = LsoTracker()
    assert tracker.observe(KEY, 10, 12, now=100.0) == (2, 0.0)
    assert tracker.observe(KEY, 10, 30, now=130.0) == (20, 30.0)
    assert tracker.observe(("output", "out", 2), 10, 30, now=130.0) == (20, 0.0)  # per key


def test_an_lso_that_moves_restarts_the_clock_even_below_the_high_watermark() -> None:
    tracker = LsoTracker()
    tracker.observe(KEY, 10, 12, now=0.0)
    assert tracker.observe(KEY, 11, 14, now=5.0) == (3, 0.0)  # a busy partition
    assert tracker.observe(KEY, 11, 15, now=9.0) == (4, 4.0)
    assert tracker.observe(KEY, 15, 15, now=10.0) == (0, 0.0)
    assert tracker.observe(KEY, 15, 16, now=11.0) == (1, 0.0)


def stats(state: str, age_ms: int = 4_594_000) -> str:
    """A report; librdkafka's ``txn_stateage`` is junk (never reset): not used."""
    return json.dumps({"name": "p", "eos": {"txn_state": state, "txn_stateage": age_ms,
                                            "producer_epoch": 3}})


def test_the_longest_producer_per_state_counts_from_its_first_report_in_that_state() -> None:
    now = [1000.0]
    states = TransactionStates(clock=lambda: now[0])
    p0, p1, p2 = (states.callback(f"a.in.{i}") for i in range(3))
    p0(stats("InTransaction"))
    now[0] += 3
    p1(stats("InTransaction"))
    p2(stats("BeginCommit"))
    p0(stats("InTransaction"))  # still: its clock keeps running
    assert states.ages() == {"InTransaction": 3.0, "BeginCommit": 0.0}
    now[0] += 4
    p0(stats("Ready"))  # a change restarts it
    assert states.ages() == {"InTransaction": 4.0, "BeginCommit": 4.0, "Ready": 0.0}
    [family] = list(states.collect())
    assert {s.labels["state"]: s.value for s in family.samples} == {
        "InTransaction": 4.0, "BeginCommit": 4.0, "Ready": 0.0}


def test_a_producer_let_go_drops_out_even_if_it_reports_late_and_junk_is_ignored() -> None:
    now = [0.0]
    states = TransactionStates(clock=lambda: now[0])
    old = states.callback("a.in.0")
    old(stats("Ready"))
    states.callback("a.in.1")("not json")
    states.callback("a.in.2")(json.dumps({"name": "no eos"}))
    now[0] = 600.0  # idle: no reports, still there, ageing
    assert states.ages() == {"Ready": 600.0}
    states.forget("a.in.0")
    old(stats("InTransaction"))  # its last report, served while it closes
    assert states.ages() == {}
    new = states.callback("a.in.0")  # the partition assigned again: a new producer
    old(stats("Ready"))
    new(stats("InTransaction"))
    assert states.ages() == {"InTransaction": 0.0}
