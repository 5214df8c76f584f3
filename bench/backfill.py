"""Backfill throughput next to the stream's, on the same input (``python -m bench.backfill``).

One broker, one pre-filled input topic (bench.throughput's workload), then:

1. ``stream``: one exactly-once replica over it (bench.throughput.measure: timed from its
   first output to its committed offsets reaching the input end, startup excluded);
2. ``backfill``: ``txstage backfill`` Kafka → Kafka on ``local[2,4]`` in this process
   (or, with ``--standalone-workers N``, on a Spark standalone cluster of N one-core
   workers started here: service.backfill.standalone), twice under two job ids:
   ``cold`` in a fresh JVM (what an operator's run costs) and ``warm`` (JIT loaded,
   Python workers started). Each reports the Spark job's own time (reading,
   transforming, writing, committing: startup and planning excluded) and its end-to-end
   time (Spark start, planning, progress topic, summary included).

Both backfills are compared with the stream's output by lineage (service.backfill.parity):
the figures only count if the outputs are the same records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import ensure_topics
from bench.throughput import TRANSFORM, broker, measure, start_run, workload
from service.backfill import config, parity
from service.backfill.job import execute
from service.backfill.report import Outcome
from service.backfill.specs import parse_sink, parse_source


@dataclass
class BackfillResult:
    name: str
    records: int
    spark_seconds: float
    total_seconds: float
    records_per_s: float  # over the Spark job
    end_to_end_per_s: float
    identical_to_stream: bool
    problems: list[str]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.backfill",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--commit-interval-ms", type=int, default=100,
                        help="the stream's TXSTAGE_COMMIT_INTERVAL_MS (design: 100)")
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--standalone-workers", type=int, default=0, metavar="N",
                        help="run the backfills on a standalone cluster of N one-core "
                             "workers started here (ignores --master)")
    parser.add_argument("--slice-records", type=int, default=None,
                        help="the backfill's --slice-records (default: its own)")
    parser.add_argument("--transaction-records", type=int, default=None,
                        help="the backfill's --transaction-records (default: its own)")
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: start a private single node)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser.parse_args(argv)


def run_backfill(bootstrap: str, topic: str, output: str, args: argparse.Namespace,
                 run_id: str, name: str) -> Outcome:
    ensure_topics(bootstrap, {output: args.partitions})
    flags = config.Flags(
        source=parse_source(f"kafka://{topic}"), sink=parse_sink(f"kafka://{output}"),
        job_id=f"bench-{run_id}-{name}", transform=TRANSFORM, dlq_topic="",
        bootstrap_servers=bootstrap, transactional_id_prefix=f"bench-{run_id}",
        master=args.master, spark_conf=args.spark_conf, progress_interval_s=0,
        **({"slice_records": args.slice_records} if args.slice_records else {}),
        **({"transaction_records": args.transaction_records}
           if args.transaction_records else {}))
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TXSTAGE_")}
    return execute(config.build(flags, env))


@contextlib.contextmanager
def spark_cluster(args: argparse.Namespace, log_dir: Path,
                  say: Callable[[str], None]) -> Iterator[None]:
    """With --standalone-workers: a cluster for the backfills, its URL as args.master."""
    args.spark_conf = {}
    if not args.standalone_workers:
        yield
        return
    from service.backfill.standalone import StandaloneSpark

    cluster = StandaloneSpark(log_dir / "spark", workers=args.standalone_workers, cores=1,
                              memory="1g")
    with cluster:
        os.environ.update(cluster.env())  # this driver's Python workers: the same paths
        args.master = cluster.master_url
        args.spark_conf = {"spark.executor.memory": "512m", "spark.executor.cores": "1"}
        say(f"spark standalone cluster {cluster.master_url}: {args.standalone_workers} "
            f"worker(s) x 1 core")
        yield


def check(bootstrap: str, stream_output: str, output: str) -> parity.ParityReport:
    return parity.compare(parity.from_topics(bootstrap, [stream_output]),
                          parity.from_topics(bootstrap, [output]),
                          rename={stream_output: output})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    say, run_id, log_dir, info = start_run("txstage-bench-backfill", json_output=args.json)
    say(f"txstage backfill bench {run_id}: {args.records:,} records x {args.value_bytes} B, "
        f"{args.partitions} partitions, {args.master}, {info['cpus']} CPUs, "
        f"load {info['loadavg_at_start']}")
    with broker(args.bootstrap, say) as bootstrap, spark_cluster(args, log_dir, say):
        w = workload(bootstrap, run_id, log_dir, args, args.partitions)
        say(f"input {w.topic}: prefilled in {w.prefill_s:.1f} s")
        stream = measure(w, "exactly_once")
        stream_output = f"bench-{run_id}-exactly_once-{w.partitions}-out"
        say(f"  stream (exactly once, {args.commit_interval_ms} ms commits): "
            f"{stream.records_per_s:,.0f} rec/s over {stream.seconds:.2f} s, "
            f"verified={stream.verified}")
        results = []
        for name in ("cold", "warm"):
            output = f"bench-{run_id}-backfill-{name}-out"
            outcome = run_backfill(bootstrap, w.topic, output, args, run_id, name)
            report = check(bootstrap, stream_output, output)
            result = BackfillResult(
                name, outcome.inputs_this_run, round(outcome.spark_seconds, 2),
                round(outcome.seconds, 2),
                round(outcome.inputs_this_run / outcome.spark_seconds, 1),
                round(outcome.inputs_this_run / outcome.seconds, 1), report.ok,
                report.problems())
            results.append(result)
            say(f"  backfill {name}: {result.records_per_s:,.0f} rec/s over the Spark job "
                f"({result.spark_seconds:.2f} s), {result.end_to_end_per_s:,.0f} rec/s end "
                f"to end ({result.total_seconds:.2f} s); identical to the stream: "
                f"{result.identical_to_stream}")
    summary = {"machine": info, "records": args.records, "partitions": args.partitions,
               "value_bytes": args.value_bytes, "master": args.master,
               "stream": {"records_per_s": stream.records_per_s, "seconds": stream.seconds,
                          "verified": stream.verified},
               "backfill": [asdict(r) for r in results],
               "ratio_backfill_warm_to_stream": round(results[-1].records_per_s
                                                      / stream.records_per_s, 2),
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        say(f"  backfill (warm) / stream: {summary['ratio_backfill_warm_to_stream']}")
    return 0 if all(r.identical_to_stream for r in results) and stream.verified else 1


if __name__ == "__main__":
    raise SystemExit(main())
