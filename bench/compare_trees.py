"""One guarantee of the stage from two source trees, and the bare loop, in one run.

``python -m bench.compare_trees --tree DIR [--guarantee at_least_once] [--rounds 3]``

``bench.throughput`` measures the code it is run from. To see what a change does to
throughput, the change and the code before it must run against the same broker and
input, interleaved: rounds of (``DIR``'s stage, this tree's stage, bare), each process
as ``bench.throughput`` runs a mode (same settings, same timing, same CPU accounting,
verified). ``DIR`` is any copy of the repository: ``git worktree add /tmp/old HEAD~1``,
or a copy with some modules compiled. It prints each run and, per tree, the median over
rounds of its ÷ bare ratio and of its loop thread's CPU-seconds per 100k records.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from bench import throughput

GUARANTEES = ("at_least_once", "exactly_once")


def _from_tree(tree: Path) -> tuple[str, ...]:
    """``python -m service run`` with ``tree`` first on the import path."""
    return ("-c", f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); "
                  "sys.argv = ['service', 'run']; runpy.run_module('service', run_name='__main__')")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True, help="the other source tree")
    parser.add_argument("--guarantee", choices=GUARANTEES, default="at_least_once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=400_000)
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    if not (tree / "service" / "__main__.py").is_file():
        raise SystemExit(f"{tree} is not a txstage source tree (no service/__main__.py)")
    say, run_id, log_dir, _ = throughput.start_run("compare-trees", json_output=False)
    runs: dict[str, list[throughput.ModeResult]] = {"tree": [], "here": [], "bare": []}
    with throughput.broker(None, say) as bootstrap:
        w = throughput.workload(bootstrap, run_id, log_dir,
                                throughput.parse_args(["--records", str(args.records)]), 8)
        throughput.warm_up(w, 50_000, say)
        w = throughput.with_broker_idle_rate(w)
        for i in range(args.rounds):
            for name, results in runs.items():
                mode = "bare" if name == "bare" else args.guarantee
                r = throughput.measure(w, mode, tag=f"-r{i}-{name}",
                                       argv=_from_tree(tree) if name == "tree" else None)
                results.append(r)
                say(f"  {name}: {r.records_per_s:,.0f} rec/s, loop "
                    f"{r.cpu_by_thread_per_100k.get('loop')} CPU-s per 100k, "
                    f"{throughput._verdict(r)}")
    say(f"{args.guarantee}, {args.rounds} rounds; tree = {tree}, here = {Path.cwd()}")
    for name in ("tree", "here"):
        ratios = [a.records_per_s / b.records_per_s for a, b in zip(runs[name], runs["bare"],
                                                                      strict=True)]
        say(f"  {name} ÷ bare: median {statistics.median(ratios):.3f} "
            f"({', '.join(f'{x:.3f}' for x in ratios)}); loop median "
            f"{statistics.median(r.cpu_by_thread_per_100k['loop'] for r in runs[name])}")
    say(f"  bare loop median "
        f"{statistics.median(r.cpu_by_thread_per_100k['loop'] for r in runs['bare'])}")
    clean = all(r.verified for rs in runs.values() for r in rs if r.mode == "exactly_once")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
