"""``bench.throughput``'s steady rate: the rate between 10 % and 90 % of the records
committed, so neither the start nor the last commit's latency is in it."""

from __future__ import annotations

import pytest

from bench.throughput import steady_rate


def test_a_slow_drain_does_not_lower_the_steady_rate() -> None:
    # 1,000 records a second, polled every 0.1 s, then the last 50 wait 0.6 s more.
    progress = [(t / 10, min(t * 100, 950)) for t in range(11)] + [(1.6, 1000)]
    assert steady_rate(progress, 1000) == pytest.approx(1000.0)


def test_crossings_are_interpolated_between_polls() -> None:
    # 0 then 500 committed at once at 1.0 s, then 1,000 at 2.0 s: 10 % is crossed at
    # 0.2 s by interpolation, 90 % at 1.8 s; 800 records in 1.6 s.
    assert steady_rate([(0.0, 0), (1.0, 500), (2.0, 1000)], 1000) == pytest.approx(500.0)


def test_one_poll_past_both_marks_gives_no_steady_rate() -> None:
    assert steady_rate([(0.0, 0), (0.1, 1000)], 1000) == pytest.approx(10_000.0)
    assert steady_rate([(0.1, 1000)], 1000) is None  # both marks crossed at once
