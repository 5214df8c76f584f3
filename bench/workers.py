"""Worker processes (``TXSTAGE_WORKERS``) as ratios measured in one run
(docs/benchmarks.md, "Worker processes").

One broker, one pre-filled input topic, then one row at a time over it, each with its
own consumer group and output topic, every row exactly-once and checked with
``service.tools.verify``:

- ``heavy_w0``, ``heavy_w1``, ``heavy_w2``: one replica running
  ``bench.transforms:sha256_heavy`` (~150 µs a record) with ``TXSTAGE_WORKERS`` 0, 1, 2
- ``heavy_2replicas``: two in-process replicas in one group, started together (the
  rate is the group's): what a user gets today without workers
- ``identity_w0``, ``identity_w2``: ``bench.transforms:identity`` with 0 and 2 workers
  (what the trip to a worker and back costs a record)

Each row's rate is the steady one (between 10 and 90 % committed, as
``bench.throughput`` measures it); its CPU per 100k records is the whole process tree's
(the main process and its worker processes), the main process's alone, and the
broker's above its idle rate when it runs on this box.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from bench.common import (
    THREAD_GROUPS,
    behind,
    cpu_by_thread_group,
    cpu_seconds,
    ensure_topics,
    metric_value,
    offset_probe,
    thread_cpu,
    tree_cpu_seconds,
)
from bench.replica import Replica
from bench.throughput import (
    POLL_S,
    STEADY,
    VARIANT,
    ModeResult,
    Workload,
    _cpu,
    _poll,
    _process,
    _ready,
    _verify,
    broker,
    start_run,
    steady_rate,
    warm_up,
    with_broker_idle_rate,
    workload,
)
from bench.transforms import identity, sha256_heavy
from service.contract.records import Record, Transform

FIRST_OUTPUT_S = 60.0  # from ready: a row with no output by then is stuck
TRANSFORMS: dict[str, Transform] = {"heavy": sha256_heavy, "identity": identity}
TARGETS = {"heavy_w2_over_w0": (">=", 1.2), "heavy_w2_over_2replicas": (">=", 0.95),
           "identity_main_cpu_w2_over_w0": ("<=", 1.5)}


@dataclass(frozen=True)
class Row:
    name: str
    transform: str  # a key of TRANSFORMS
    workers: int    # TXSTAGE_WORKERS
    replicas: int = 1


ROWS = (Row("heavy_w0", "heavy", 0), Row("heavy_w1", "heavy", 1), Row("heavy_w2", "heavy", 2),
        Row("heavy_2replicas", "heavy", 0, replicas=2),
        Row("identity_w0", "identity", 0), Row("identity_w2", "identity", 2))


@dataclass
class RowResult(ModeResult):
    """A row: ``ModeResult``'s figures (``cpu_s_per_100k`` is the main processes'),
    and the whole process trees'."""

    workers: int = 0
    replicas: int = 1
    tree_cpu_s_per_100k: float | None = None
    # seconds the workers ran chunks over (window * workers), from txstage_worker_busy_seconds
    worker_busy: float | None = None
    exit_codes: tuple[int, ...] = ()
    error: str | None = None  # the row did not finish: why (and no figures)

    @property
    def rate(self) -> float | None:
        """The steady rate, or the end-to-end one when the run was too short for it."""
        if self.error is not None:
            return None
        return self.steady_records_per_s or self.records_per_s

    @property
    def clean(self) -> bool:
        return self.error is None and bool(self.verified) and not any(self.exit_codes)


def failed_row(w: Workload, row: Row, error: BaseException) -> RowResult:
    """A row that did not finish (a replica exited, or made no progress in time)."""
    return RowResult(mode=row.name, partitions=w.partitions, records=w.records, seconds=0.0,
                     records_per_s=0.0, mb_per_s=0.0, startup_s=0.0, exit_code=-1, log="",
                     workers=row.workers, replicas=row.replicas,
                     error=str(error).splitlines()[0])


def transform_cost_us(transform: Transform, value_bytes: int, number: int = 2000) -> float:
    """µs a call of ``transform`` takes here on a record like the input's (timeit, best
    of 5): the transform's own cost, without the stage."""
    value = (b"12345:" + b"." * value_bytes)[:value_bytes]
    record = Record("bench", 0, 12345, 0, b"k12345", value)
    best = min(timeit.repeat(lambda: list(transform(record)), number=number, repeat=5))
    return round(best / number * 1e6, 2)


def _alive(procs: Sequence[Replica], condition: Callable[[], bool]) -> Callable[[], bool]:
    """``condition``, failing as soon as any of ``procs`` but the first has exited
    (``_poll`` watches the first)."""
    def check() -> bool:
        for proc in procs[1:]:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited ({proc.returncode()})\n"
                                   f"{proc.log_excerpt()}")
        return condition()
    return check


def _has_partitions(proc: Replica) -> bool:
    answer = proc.answer("/readyz", 0.5)
    return answer is not None and answer[0] == 200 and \
        (json.loads(answer[1]).get("assigned") or 0) > 0


def group_steady_rate(progress: Sequence[tuple[float, int]], records: int,
                      since: float) -> float | None:
    """``steady_rate`` (10 to 90 % committed), but from ``since`` when that is later: a
    group's replicas started together do not join together, and until the last one
    has partitions the first works alone. Then the rate is from the first poll at or
    after ``since`` to the first at or past 90 %."""
    later = [(when, done) for when, done in progress if when >= since]
    if not later or later[0][1] <= STEADY[0] * records:
        return steady_rate(progress, records)
    start = later[0]
    end = next(((when, done) for when, done in later if done >= STEADY[1] * records), None)
    if end is None or end[0] <= start[0]:
        return None
    return round((end[1] - start[1]) / (end[0] - start[0]), 1)


def _busy_seconds(procs: Sequence[Replica]) -> float:
    return sum(metric_value(p.scrape(), "txstage_worker_busy_seconds") or 0.0 for p in procs)


def measure_row(w: Workload, row: Row, tag: str = "") -> RowResult:
    """Run ``row``'s replicas over the workload until everything is committed, then
    verify the output against the row's transform."""
    group = f"bench-{w.run_id}-{row.name}{tag}"
    output = f"{group}-out"
    ensure_topics(w.bootstrap, {output: w.outputs})
    out_keys = [(output, p) for p in range(w.outputs)]
    settings = replace(w, variant=(("TXSTAGE_TRANSFORM", f"bench.transforms:"
                                    f"{TRANSFORMS[row.transform].__name__}"),
                                   ("TXSTAGE_WORKERS", str(row.workers))))
    procs = [_process(settings, VARIANT, group, output, None, log_suffix=f"-{i}")
             for i in range(row.replicas)]
    load = os.getloadavg()[0]
    with offset_probe(w.bootstrap, group) as probe:
        for proc in procs:
            proc.start()
        try:
            _poll(_alive(procs, _ready(procs[0])), procs[0], 120, 0.02, "readiness")
            first = _poll(_alive(procs, lambda: sum(probe.end_offsets(out_keys).values()) > 0),
                          procs[0], FIRST_OUTPUT_S, 0.02, "first output")
            pids = [p.pid for p in procs]
            cpu_first = cpu_seconds(pids), cpu_seconds(w.broker_pids)
            tree_first, threads_first = tree_cpu_seconds(pids), thread_cpu(pids[0])
            busy_first = _busy_seconds(procs)
            progress: list[tuple[float, int]] = []
            since: list[float] = []  # when every replica first had partitions

            def all_committed() -> bool:
                left = behind(w.ends, probe.committed(w.ends))
                progress.append((time.monotonic(), w.records - left))
                if not since and all(map(_has_partitions, procs)):
                    since.append(progress[-1][0])
                return left == 0
            done = _poll(_alive(procs, all_committed), procs[0], w.timeout_s, POLL_S,
                         "all inputs committed")
            cpu_done = cpu_seconds(pids), cpu_seconds(w.broker_pids)
            tree_done, threads_done = tree_cpu_seconds(pids), thread_cpu(pids[0])
            busy_done = _busy_seconds(procs)
        finally:
            codes = tuple(proc.stop() for proc in procs)
    seconds = done - first
    per_100k = 100_000 / w.records
    result = RowResult(mode=row.name, partitions=w.partitions, records=w.records,
                       seconds=round(seconds, 3), records_per_s=round(w.records / seconds, 1),
                       mb_per_s=round(w.records * w.value_bytes / seconds / 1e6, 2),
                       startup_s=0.0, exit_code=max(codes), log=str(procs[0].log_path),
                       loadavg_1m=round(load, 2), output_topic=output, workers=row.workers,
                       replicas=row.replicas, exit_codes=codes)
    if not since:
        raise RuntimeError(f"{row.name}: a replica never had partitions while it ran")
    result.steady_records_per_s = group_steady_rate(progress, w.records, since[0])
    _cpu(result, w, cpu_first, cpu_done)
    if tree_first is not None and tree_done is not None:
        result.tree_cpu_s_per_100k = round((tree_done - tree_first) * per_100k, 3)
    own0, own1 = cpu_first[0], cpu_done[0]
    if row.replicas == 1 and own0 is not None and own1 is not None and threads_done:
        result.cpu_by_thread_per_100k = {
            g: round(s * per_100k, 3) for g, s in
            cpu_by_thread_group(pids[0], threads_first, threads_done, own1 - own0).items()}
    if row.workers:
        result.worker_busy = round((busy_done - busy_first) / (seconds * row.workers), 3)
    _verify(result, w, group, output, TRANSFORMS[row.transform])
    return result


# ------------------------------------------------------------------------------ report


def _ratio(a: float | None, b: float | None) -> float:
    return round(a / b, 3) if a is not None and b else float("nan")


# name: (figure, row over row); NaN when a row is missing or did not finish
RATIOS = {"heavy_w2_over_w0": ("rate", "heavy_w2", "heavy_w0"),
          "heavy_w1_over_w0": ("rate", "heavy_w1", "heavy_w0"),
          "heavy_w2_over_2replicas": ("rate", "heavy_w2", "heavy_2replicas"),
          "heavy_2replicas_over_w0": ("rate", "heavy_2replicas", "heavy_w0"),
          "identity_w2_over_w0": ("rate", "identity_w2", "identity_w0"),
          "identity_main_cpu_w2_over_w0": ("cpu_s_per_100k", "identity_w2", "identity_w0"),
          "identity_tree_cpu_w2_over_w0": ("tree_cpu_s_per_100k", "identity_w2",
                                           "identity_w0")}


def ratios(results: dict[str, RowResult]) -> dict[str, float]:
    def figure(name: str, row: str) -> float | None:
        r = results.get(row)
        return None if r is None or r.error is not None else getattr(r, name)
    return {ratio: _ratio(figure(name, a), figure(name, b))
            for ratio, (name, a, b) in RATIOS.items()}


def met(name: str, value: float) -> bool:
    sense, target = TARGETS[name]
    return value >= target if sense == ">=" else value <= target


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(results: Sequence[RowResult]) -> list[str]:
    lines = [f"{'row':<17}{'rec/s':>9}{'steady':>9}{'CPU-s/100k: tree':>18}{'main':>7}"
             f"{'broker':>8}{'busy':>6}{'load':>6}  main by thread"
             f" ({'/'.join(THREAD_GROUPS)})  verify"]
    for r in results:
        if r.error is not None:
            lines.append(f"{r.mode:<17}did not finish: {r.error}")
            continue
        threads = "/".join(f"{r.cpu_by_thread_per_100k[g]:.2f}" for g in THREAD_GROUPS) \
            if r.cpu_by_thread_per_100k else "-"
        verdict = "clean" if r.clean else \
            f"{len(r.problems)} problem(s), {r.duplicates} duplicates, exit {r.exit_codes}"
        lines.append(f"{r.mode:<17}{r.records_per_s:>9,.0f}{_fmt(r.steady_records_per_s, 0):>9}"
                     f"{_fmt(r.tree_cpu_s_per_100k):>18}{_fmt(r.cpu_s_per_100k):>7}"
                     f"{_fmt(r.broker_cpu_s_per_100k):>8}{_fmt(r.worker_busy):>6}"
                     f"{r.loadavg_1m:>6.2f}  {threads:<31}{verdict}")
    return lines


def report(args: argparse.Namespace, info: dict[str, object], costs: dict[str, float],
           rounds: list[dict[str, RowResult]]) -> int:
    found = {name: statistics.median(ratios(r)[name] for r in rounds) for name in RATIOS}
    clean = all(r.clean for rs in rounds for r in rs.values())
    if args.json:
        print(json.dumps({"machine": info, "transform_cost_us": costs, "ratios": found,
                          "rounds": [{n: asdict(r) for n, r in rs.items()} for rs in rounds],
                          "exactly_once_verified": clean}, indent=2))
        return 0 if clean else 1
    lines = ["", "transform's own cost, µs a call (timeit, this process): "
             + ", ".join(f"{name} {us:.1f}" for name, us in costs.items())]
    for i, results in enumerate(rounds):
        lines += ([f"round {i + 1}:"] if len(rounds) > 1 else []) + table(list(results.values()))
    lines += ["", "ratios" + (" (median over rounds)" if len(rounds) > 1 else "")
              + " of steady rec/s, and of CPU per record:"]
    for name, value in found.items():
        target = TARGETS.get(name)
        verdict = (f"  (target {target[0]} {target[1]}: "
                   f"{'met' if met(name, value) else 'NOT met'})") if target else ""
        if not math.isnan(value):  # both rows ran
            lines.append(f"  {name:<30}{value:>7.3f}{verdict}")
    lines += ["", f"exactly-once lineage check (V1-V5) of every row: "
              f"{'clean' if clean else 'FAILED'}"]
    for results in rounds:
        lines += [f"  {r.mode}: {p}" for r in results.values() for p in r.problems]
        lines += [f"  {r.mode}: did not finish: {r.error}" for r in results.values() if r.error]
    print("\n".join(lines))
    return 0 if clean else 1


# -------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.workers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: start a private single node)")
    parser.add_argument("--warm-up", type=int, default=20_000, metavar="RECORDS",
                        help="records an unmeasured replica processes first (0: none)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the rows this many times, interleaved; median ratios")
    parser.add_argument("--rows", default=",".join(r.name for r in ROWS),
                        help="a comma-separated subset of the rows (ratios need them all)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = [r for r in ROWS if r.name in args.rows.split(",")]
    say, run_id, log_dir, info = start_run("txstage-bench-workers", json_output=args.json)
    costs = {name: transform_cost_us(t, args.value_bytes) for name, t in TRANSFORMS.items()}
    say(f"txstage bench workers {run_id}: {args.records:,} records x {args.value_bytes} B, "
        f"{args.partitions} partitions, {info['cpus']} CPUs, load {info['loadavg_at_start']}, "
        f"code {info['code']}; "
        f"transform µs a call here: {costs}; logs in {log_dir}")
    rounds: list[dict[str, RowResult]] = []
    with broker(args.bootstrap, say) as bootstrap:
        w = workload(bootstrap, run_id, log_dir, args, args.partitions)
        say(f"input {w.topic}: prefilled in {w.prefill_s:.1f} s")
        warm_up(w, args.warm_up, say)
        w = with_broker_idle_rate(w)
        for i in range(args.repeat):
            results = {}
            for row in rows:
                try:
                    r = measure_row(w, row, f"-r{i}" if args.repeat > 1 else "")
                except (RuntimeError, TimeoutError) as exc:  # the other rows still count
                    r = failed_row(w, row, exc)
                    say(f"  {row.name}: did not finish: {exc}")
                else:
                    say(f"  {row.name}: steady {_fmt(r.steady_records_per_s, 0)} rec/s, tree "
                        f"{_fmt(r.tree_cpu_s_per_100k)} CPU-s/100k (load {r.loadavg_1m:.2f}), "
                        f"{'clean' if r.clean else 'NOT clean'}")
                results[row.name] = r
            rounds.append(results)
    return report(args, info, costs, rounds)


if __name__ == "__main__":
    sys.exit(main())
