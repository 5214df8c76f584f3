"""The broker's bill on a steady feed, per transaction mode, at few and many partitions
(docs/benchmarks.md, "Transactions at many partitions"):

    python -m bench.broker_bill --partitions 8 64 --rate 10000 --seconds 30

After an unmeasured warm-up row (``--warm-up-s``), for each partition count and each
mode (the default, one transaction per input partition;
``TXSTAGE_MAX_TRANSACTIONS_PER_S=100``; ``TXSTAGE_TRANSACTIONS=spanning``), one after
the other on one broker: fresh input and output topics of that many
partitions, one exactly-once replica (``bench.transforms:identity``), a feeder
appending ``--rate`` records a second for ``--seconds`` (bench.latency's: each value
stamped with the time it was handed over) and a ``read_committed`` reader of the
output. Each row: the rate fed, transactions committed per 100k records, the stage's
and the broker's CPU-s per 100k records over the feed (the broker's above its idle
rate, measured first), and the end-to-end latency (append → read, read_committed,
after the first 3 s) p50 and p99. Every output is read back, or the row says so.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import cpu_seconds, ensure_topics, free_port, histogram, listening_pids, stage_env
from bench.latency import Reading, feed, read_latencies
from bench.replica import Replica
from bench.throughput import broker

MODES = (("per partition", ()), ("budget 100/s", (("TXSTAGE_MAX_TRANSACTIONS_PER_S", "100"),)),
         ("spanning", (("TXSTAGE_TRANSACTIONS", "spanning"),)))
SKIP_S = 3.0


@dataclass(frozen=True)
class Row:
    partitions: int
    mode: str
    fed_per_s: float
    transactions_per_100k: float
    stage_cpu_per_100k: float | None
    broker_cpu_per_100k: float | None
    e2e_p50_ms: float
    e2e_p99_ms: float
    complete: bool


def measure(bootstrap: str, run_id: str, log_dir: Path, count: int, mode: str,
            extra: tuple[tuple[str, str], ...], args: argparse.Namespace,
            broker_pids: tuple[int, ...], broker_idle_per_s: float) -> Row:
    tag = f"{run_id}-{count}-{MODES.index((mode, extra))}"
    topic, output = f"bill-{tag}-in", f"bill-{tag}-out"
    ensure_topics(bootstrap, {topic: count, output: count})
    port = free_port()
    replica = Replica(f"replica-{tag}", stage_env({
        "TXSTAGE_BOOTSTRAP_SERVERS": bootstrap, "TXSTAGE_GROUP_ID": f"bill-{tag}",
        "TXSTAGE_INPUT_TOPICS": topic, "TXSTAGE_OUTPUT_TOPIC": output,
        "TXSTAGE_TRANSFORM": "bench.transforms:identity",
        "TXSTAGE_COMMIT_INTERVAL_MS": str(args.commit_interval_ms),
        "TXSTAGE_LOG_FORMAT": "json", "TXSTAGE_METRICS_HOST": "127.0.0.1",
        "TXSTAGE_METRICS_PORT": str(port), **dict(extra)}),
        log_dir / f"replica-{tag}.log", port).start()
    total: list[int] = [0]
    latencies: list[Reading] = []
    try:
        replica.wait_ready(60)
        expected = threading.Event()
        reader = threading.Thread(target=read_latencies, daemon=True, args=(
            bootstrap, output, expected, total, latencies, args.seconds + 120))
        reader.start()
        stage_before, broker_before = cpu_seconds([replica.pid]), cpu_seconds(broker_pids)
        sent, took = feed(bootstrap, topic, args.rate, args.seconds, args.value_bytes,
                          threading.Event())
        total[0] = sent
        expected.set()
        reader.join(args.seconds + 130)
        stage_after, broker_after = cpu_seconds([replica.pid]), cpu_seconds(broker_pids)
        scraped = replica.scrape()
    finally:
        replica.stop()
    per_100k = 100_000 / sent if sent else 0.0
    stage_cpu = None if stage_before is None or stage_after is None else \
        (stage_after - stage_before) * per_100k
    broker_cpu = None if broker_before is None or broker_after is None else \
        (broker_after - broker_before - broker_idle_per_s * took) * per_100k
    commits = histogram(scraped, "txstage_transaction_commit_seconds").count or 0
    first_read = latencies[0][0] if latencies else 0.0
    steady = [latency for at, latency, _ in latencies if at - first_read >= SKIP_S] or [0.0]
    cuts = statistics.quantiles(steady, n=100, method="inclusive") if len(steady) > 1 \
        else [steady[0]] * 99
    return Row(count, mode, sent / took, commits * per_100k, stage_cpu, broker_cpu,
               cuts[49] * 1000, cuts[98] * 1000, len(latencies) >= sent)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_bill", description=__doc__)
    parser.add_argument("--partitions", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--rate", type=int, default=10_000, help="input records per second")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--warm-up-s", type=float, default=15.0,
                        help="an unmeasured row first, this long")
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: a private one started here)")
    args = parser.parse_args(argv)
    run_id = uuid.uuid4().hex[:6]
    log_dir = Path(tempfile.mkdtemp(prefix=f"txstage-bill-{run_id}-"))
    print(f"txstage broker bill {run_id}: {args.rate:,} rec/s for {args.seconds:.0f} s, "
          f"{args.value_bytes} B, partitions {args.partitions}; logs in {log_dir}", flush=True)
    rows: list[Row] = []
    with broker(args.bootstrap, print) as bootstrap:
        pids = listening_pids(bootstrap)
        idle_before = cpu_seconds(pids)
        time.sleep(3.0)
        idle_after = cpu_seconds(pids)
        idle = 0.0 if idle_before is None or idle_after is None else \
            (idle_after - idle_before) / 3.0
        # A fresh broker's JVM compiles its hot paths over the first seconds of load:
        # an unmeasured row first, or the first measured row pays for it.
        warm = argparse.Namespace(**{**vars(args), "seconds": args.warm_up_s})
        measure(bootstrap, run_id + "w", log_dir, min(args.partitions), *MODES[0], warm, pids,
                idle)
        for count in args.partitions:
            for mode, extra in MODES:
                row = measure(bootstrap, run_id, log_dir, count, mode, extra, args, pids, idle)
                print(f"  {count} partitions, {mode}: e2e p99 {row.e2e_p99_ms:.0f} ms, "
                      f"complete {row.complete}", flush=True)
                rows.append(row)
    print(table(rows))
    return 0 if all(r.complete for r in rows) else 1


def table(rows: Sequence[Row]) -> str:
    lines = ["| partitions | mode | fed rec/s | partition commits /100k | stage CPU-s /100k | "
             "broker CPU-s /100k | e2e p50 ms | e2e p99 ms | all read |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.partitions} | {r.mode} | {r.fed_per_s:,.0f} | "
              f"{r.transactions_per_100k:,.0f} | {_f(r.stage_cpu_per_100k)} | "
              f"{_f(r.broker_cpu_per_100k)} | {r.e2e_p50_ms:.0f} | {r.e2e_p99_ms:.0f} | "
              f"{r.complete} |" for r in rows]
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
