"""The transaction budget (TXSTAGE_MAX_TRANSACTIONS_PER_S) and spanning transactions at
few and many partitions, as ratios measured in one run on one private broker
(docs/benchmarks.md):

    python -m bench.budget --records 400000 --repeat 3

For each partition count (8 and 64 by default), one input topic is pre-filled and
warmed by an unmeasured replica; then each round runs three exactly-once replicas over
every topic, one after the other, each in its own group: with
``TXSTAGE_MAX_TRANSACTIONS_PER_S=100``, with the default (no budget: one transaction
per busy partition per commit interval, whatever their number) and with
``TXSTAGE_TRANSACTIONS=spanning`` (one transaction for all of the replica's
partitions). Rounds interleave, so drift on the box touches every row alike. Each row
gives the medians over the rounds of records/s, the stage's and the broker's CPU-s
per 100k records, transactions per 100k records and the commit p99, and every run is
verified exactly-once like every throughput row. The ratios below the table divide
each mode at the largest count by the default at the smallest, and by itself there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bench.throughput import (
    VARIANT,
    ModeResult,
    broker,
    measure,
    start_run,
    warm_up,
    with_broker_idle_rate,
    workload,
)

BUDGET = (("TXSTAGE_MAX_TRANSACTIONS_PER_S", "100"),)
SPANNING = (("TXSTAGE_TRANSACTIONS", "spanning"),)
DEFAULT = "per partition"
# (row label, bench.throughput mode, that mode's extra settings), each in its own group
MODES = (("budget 100/s", VARIANT, BUDGET), (DEFAULT, "exactly_once", ()),
         ("spanning", VARIANT, SPANNING))


@dataclass(frozen=True)
class Row:
    """One mode at one partition count: the medians over its rounds."""
    partitions: int
    mode: str
    rounds: int
    verified: bool
    records_per_s: float
    stage_cpu: float | None
    broker_cpu: float | None
    transactions_per_100k: float
    commit_p99_ms: float | None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__)
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds, interleaved; each row gives the medians")
    parser.add_argument("--warm-up", type=int, default=200_000, metavar="RECORDS",
                        help="records an unmeasured replica takes from each input first")
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: a private one started here)")
    args = parser.parse_args(argv)
    say, run_id, log_dir, info = start_run("txstage-budget", json_output=False)
    say(f"txstage budget bench {run_id}: {args.records:,} records x {args.value_bytes} B, "
        f"partitions {args.partitions}, {args.repeat} rounds, {info['cpus']} CPUs, load "
        f"{info['loadavg_at_start']}; logs in {log_dir}")
    runs: dict[tuple[int, str], list[ModeResult]] = {}
    with broker(args.bootstrap, say) as bootstrap:
        workloads = []
        for count in args.partitions:
            w = workload(bootstrap, run_id, log_dir, args, count)
            warm_up(w, args.warm_up, say)
            workloads.append(w)
        workloads = [with_broker_idle_rate(w) for w in workloads]
        for round_ in range(args.repeat):
            for w in workloads:
                for i, (label, mode, variant) in enumerate(MODES):
                    result = measure(replace(w, variant=variant), mode,
                                     tag=f"-{w.partitions}-{i}-r{round_}")
                    say(f"  round {round_ + 1}, {w.partitions} partitions, {label}: "
                        f"{result.records_per_s:,.0f} rec/s, broker "
                        f"{_f(result.broker_cpu_s_per_100k)} CPU-s/100k, "
                        f"verified {result.verified}")
                    runs.setdefault((w.partitions, label), []).append(result)
    rows = [_row(count, label, results) for (count, label), results in runs.items()]
    print(table(rows))
    print(ratios(rows))
    return 0 if all(r.verified for r in rows) else 1


def _row(count: int, label: str, results: list[ModeResult]) -> Row:
    def med(get: Callable[[ModeResult], float | None]) -> float | None:
        values = [v for v in map(get, results) if v is not None]
        return statistics.median(values) if values else None
    return Row(count, label, len(results), all(r.verified for r in results),
               med(lambda r: r.records_per_s) or 0.0, med(lambda r: r.cpu_s_per_100k),
               med(lambda r: r.broker_cpu_s_per_100k),
               med(lambda r: r.transactions * 100_000 / r.records if r.records else 0.0)
               or 0.0, med(lambda r: r.commit_p99_ms))


def table(rows: Sequence[Row]) -> str:
    lines = ["| partitions | mode | records/s | stage CPU-s /100k | broker CPU-s /100k | "
             "transactions /100k | commit p99 ms | verified |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.partitions} | {r.mode} | {r.records_per_s:,.0f} | "
                     f"{_f(r.stage_cpu)} | {_f(r.broker_cpu)} | "
                     f"{r.transactions_per_100k:,.0f} | {_f(r.commit_p99_ms, 1)} | "
                     f"{r.verified} |")
    return "\n".join(lines)


def ratios(rows: Sequence[Row]) -> str:
    """Each mode at the largest partition count over the default, and over itself, at
    the smallest: the issue's two goals (broker CPU ≤ 1.2, records/s ≥ 0.8)."""
    low, high = min(r.partitions for r in rows), max(r.partitions for r in rows)
    at = {(r.partitions, r.mode): r for r in rows}
    base = at.get((low, DEFAULT))
    lines = [f"| mode at {high} | broker CPU ÷ {DEFAULT} at {low} | ÷ itself at {low} | "
             f"records/s ÷ {DEFAULT} at {low} | ÷ itself at {low} |", "|---|---|---|---|---|"]
    for label, _, _ in MODES:
        big, own = at.get((high, label)), at.get((low, label))
        if big is None or own is None or base is None:
            continue
        lines.append(f"| {label} | {_ratio(big.broker_cpu, base.broker_cpu)} | "
                     f"{_ratio(big.broker_cpu, own.broker_cpu)} | "
                     f"{_ratio(big.records_per_s, base.records_per_s)} | "
                     f"{_ratio(big.records_per_s, own.records_per_s)} |")
    return "\n".join(lines)


def _ratio(top: float | None, bottom: float | None) -> str:
    return "n/a" if top is None or not bottom else f"{top / bottom:.2f}"


def _f(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
