"""bench.workers' pure parts: a group's steady rate counts only once every replica
works, and a row that did not finish leaves its ratios out instead of failing the run."""

from __future__ import annotations

import math

import pytest

from bench.throughput import steady_rate
from bench.workers import ROWS, RowResult, group_steady_rate, ratios


def test_a_group_is_timed_from_when_its_last_replica_had_partitions() -> None:
    # 1,000 records a second alone for 3 s, then 2,000 a second together
    progress = [(t / 10, 100 * t) for t in range(31)]
    progress += [(3 + t / 10, 3000 + 200 * t) for t in range(1, 36)]
    assert progress[-1][1] == 10_000
    assert steady_rate(progress, 10_000) < 1700  # the lone start drags it down
    assert group_steady_rate(progress, 10_000, since=3.0) == pytest.approx(2000)


def test_a_group_joined_before_the_steady_window_is_timed_as_one_replica() -> None:
    progress = [(t / 10, 100 * t) for t in range(101)]
    assert group_steady_rate(progress, 10_000, since=0.5) == steady_rate(progress, 10_000)


def test_a_group_joined_after_the_90_percent_mark_has_no_steady_rate() -> None:
    progress = [(t / 10, 100 * t) for t in range(101)]
    assert group_steady_rate(progress, 10_000, since=9.5) is None


def row(name: str, rate: float | None = None, cpu: float | None = None,
        error: str | None = None) -> RowResult:
    return RowResult(mode=name, partitions=8, records=1000, seconds=1.0,
                     records_per_s=rate or 0.0, mb_per_s=0.0, startup_s=0.0, exit_code=0,
                     log="", steady_records_per_s=rate, cpu_s_per_100k=cpu, error=error)


def test_ratios_of_the_rows_that_finished() -> None:
    results = {r.name: row(r.name, rate=1000.0, cpu=1.0) for r in ROWS}
    results["heavy_w2"] = row("heavy_w2", rate=1300.0)
    results["identity_w2"] = row("identity_w2", error="no first output after 60 s")
    found = ratios(results)
    assert found["heavy_w2_over_w0"] == pytest.approx(1.3)
    assert math.isnan(found["identity_main_cpu_w2_over_w0"])
    assert not results["identity_w2"].clean


def test_the_report_of_a_round_with_a_row_that_did_not_finish(
        capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import json

    from bench.workers import report

    results = {r.name: row(r.name, rate=1000.0, cpu=1.0) for r in ROWS}
    for r in results.values():
        r.verified = True
    results["identity_w2"] = row("identity_w2", error="no first output after 60 s")
    code = report(argparse.Namespace(json=True), {"cpus": 2}, {"heavy": 140.0}, [results])
    summary = json.loads(capsys.readouterr().out)
    assert code == 1 and summary["exactly_once_verified"] is False
    assert summary["rounds"][0]["identity_w2"]["error"] == "no first output after 60 s"
    assert report(argparse.Namespace(json=False), {}, {"heavy": 140.0}, [results]) == 1
    text = capsys.readouterr().out
    assert "identity_w2      did not finish: no first output after 60 s" in text
    assert "heavy_w2_over_w0                1.000  (target >= 1.2: NOT met)" in text
