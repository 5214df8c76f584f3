"""service/observability/interpreter.py: the stage's and the backfill tasks' interpreter settings.

Each check runs in a fresh interpreter: freezing the collector is process-wide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_tuning_freezes_what_start_up_made_and_collects_the_young_every_20000() -> None:
    out = _run("import gc\n"
               "from service.observability import interpreter\n"
               "before = gc.get_threshold()[0]\n"
               "interpreter.tune_gc()\n"
               "print(before, gc.get_threshold()[0], gc.get_freeze_count() > 1000)")
    assert out == "700 20000 True"


def test_a_backfill_task_tunes_its_spark_worker_once() -> None:
    # processor() is what every backfill task body calls first, on the worker
    out = _run("import gc\n"
               "from service.backfill.tasks import Processing, processor\n"
               "spec = Processing('service.examples.square:square', 'out', None, 1000)\n"
               "processor(spec)\n"
               "frozen = gc.get_freeze_count()\n"
               "processor(spec)\n"
               "print(gc.get_threshold()[0], frozen > 1000, gc.get_freeze_count() == frozen)")
    assert out == "20000 True True"
