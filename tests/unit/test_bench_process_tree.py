"""The benchmark's CPU of a process tree (``bench.common.tree_cpu_seconds``): a stage
with ``TXSTAGE_WORKERS`` spends most of its CPU in children the main pid's own figure
leaves out, so every descendant counts, whichever thread started it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.common import cpu_seconds, process_tree, tree_cpu_seconds

TICKS = os.sysconf("SC_CLK_TCK")


def fake_process(proc: Path, pid: int, utime: int, stime: int,
                 children: dict[int, list[int]] | None = None) -> None:
    """/proc/<pid>/stat (utime, stime and no reaped children) and, per thread, the
    children it started."""
    (proc / str(pid)).mkdir(parents=True)
    fields = ["S"] + ["0"] * 10 + [str(utime), str(stime), "0", "0"] + ["0"] * 5
    (proc / str(pid) / "stat").write_text(f"{pid} (python (x)) {' '.join(fields)}\n")
    for tid, started in (children or {pid: []}).items():
        (proc / str(pid) / "task" / str(tid)).mkdir(parents=True)
        (proc / str(pid) / "task" / str(tid) / "children").write_text(
            "".join(f"{c} " for c in started))


def test_every_descendant_counts_whichever_thread_started_it(tmp_path: Path) -> None:
    fake_process(tmp_path, 10, 100, 50, {10: [20], 11: [30]})  # thread 11 started 30
    fake_process(tmp_path, 20, 200, 0)
    fake_process(tmp_path, 30, 300, 10, {30: [40]})
    fake_process(tmp_path, 40, 5, 5)
    fake_process(tmp_path, 99, 1000, 0)  # not in the tree
    assert process_tree(10, tmp_path) == [10, 20, 30, 40]
    assert tree_cpu_seconds([10], tmp_path) == pytest.approx(670 / TICKS)
    assert cpu_seconds([10], tmp_path) == pytest.approx(150 / TICKS)  # the main pid alone


def test_a_process_gone_before_its_reading_gives_no_figure(tmp_path: Path) -> None:
    fake_process(tmp_path, 10, 1, 1, {10: [20]})  # 20 listed, but already gone
    assert tree_cpu_seconds([10], tmp_path) is None


def test_this_process_and_a_child_of_it() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in process_tree(os.getpid())
    finally:
        child.kill()
        child.wait()
