"""The transaction budget (TXSTAGE_MAX_TRANSACTIONS_PER_S) at few and many partitions,
as ratios measured in one run on one private broker (docs/benchmarks.md):

    python -m bench.budget --records 200000 --partitions 8 64

For each partition count, one input topic is pre-filled and three exactly-once replicas
run over it, one after the other, each in its own group: with
``TXSTAGE_MAX_TRANSACTIONS_PER_S=100``, with the default (no budget: one transaction
per busy partition per commit interval, whatever their number) and with
``TXSTAGE_TRANSACTIONS=spanning`` (one transaction for all of the replica's
partitions). Each row gives records/s, the stage's and the broker's CPU-s per 100k
records, transactions per 100k records and the commit p99, and is verified
exactly-once like every throughput row.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

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
# (row label, bench.throughput mode, that mode's extra settings), each in its own group
MODES = (("budget 100/s", VARIANT, BUDGET), ("no budget", "exactly_once", ()),
         ("spanning", VARIANT, SPANNING))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: a private one started here)")
    args = parser.parse_args(argv)
    say, run_id, log_dir, info = start_run("txstage-budget", json_output=False)
    say(f"txstage budget bench {run_id}: {args.records:,} records x {args.value_bytes} B, "
        f"partitions {args.partitions}, {info['cpus']} CPUs, load "
        f"{info['loadavg_at_start']}; logs in {log_dir}")
    rows: list[tuple[int, str, ModeResult]] = []
    with broker(args.bootstrap, say) as bootstrap:
        for count in args.partitions:
            w = replace(workload(bootstrap, run_id, log_dir, args, count), variant=BUDGET)
            if not rows:
                warm_up(w, 50_000, say)
            w = with_broker_idle_rate(w)
            for i, (label, mode, variant) in enumerate(MODES):
                result = measure(replace(w, variant=variant), mode, tag=f"-{count}-{i}")
                say(f"  {count} partitions, {label}: {result.records_per_s:,.0f} rec/s, "
                    f"verified {result.verified}")
                rows.append((count, label, result))
    print(table(rows))
    return 0 if all(r.verified for _, _, r in rows) else 1


def table(rows: Sequence[tuple[int, str, ModeResult]]) -> str:
    lines = ["| partitions | mode | records/s | stage CPU-s /100k | broker CPU-s /100k | "
             "transactions /100k | commit p99 ms | verified |",
             "|---|---|---|---|---|---|---|---|"]
    for count, label, r in rows:
        per_100k = r.transactions * 100_000 / r.records if r.records else 0.0
        lines.append(f"| {count} | {label} | {r.records_per_s:,.0f} | {_f(r.cpu_s_per_100k)} | "
                     f"{_f(r.broker_cpu_s_per_100k)} | {per_100k:,.0f} | "
                     f"{_f(r.commit_p99_ms, 1)} | {r.verified} |")
    return "\n".join(lines)


def _f(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
