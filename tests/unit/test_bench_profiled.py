"""``bench.throughput --profile``: the profile is written although the stage leaves
with ``os._exit`` (it used to write nothing)."""

from __future__ import annotations

import pstats
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_profile_is_written_when_the_stage_leaves_with_os_exit(tmp_path: Path) -> None:
    out = tmp_path / "stage.prof"
    script = (
        "import os, service.cli, bench.profiled\n"
        "def stage(argv):\n"
        "    assert argv == ['run'], argv\n"
        "    sum(range(1000))\n"
        "    os._exit(3)  # as service.cli._exit_now leaves\n"
        "service.cli.main = stage\n"
        f"bench.profiled.main(['cprofile', {str(out)!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert out.exists(), "no profile written"
    names = {func[2] for func in pstats.Stats(str(out)).stats}  # type: ignore[attr-defined]
    assert "stage" in names
