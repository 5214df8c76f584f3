"""The README's quick path, run verbatim with bash on a fresh broker: the block between
``<!-- quick-path -->`` and ``<!-- /quick-path -->``. The harness adds ``set -e`` before
it and a ``wait`` for the stage after it, and gives ``txstage kafka up`` a cache of its
own (the installed jars, fresh data), so the broker it starts is new.

Takes ≈ 9 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.harness.stage import REPO_ROOT

pytestmark = pytest.mark.kafka

START, END = "<!-- quick-path -->", "<!-- /quick-path -->"


def quick_path() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme[readme.index(START) + len(START):readme.index(END)]
    match = re.fullmatch(r"\s*```sh\n(.*?)```\s*", block, re.S)
    assert match, "the quick path is one ```sh block"
    return match.group(1)


def test_the_readmes_quick_path_works_verbatim_on_a_fresh_broker(tmp_path: Path) -> None:
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", 9092)) != 0, "port 9092 is taken: stop that broker"
    cache = tmp_path / "cache"
    cache.mkdir()
    jars = next((Path.home() / ".cache" / "txstage").glob("kafka-*"))
    (cache / jars.name).symlink_to(jars)  # installed by make test; the data is new
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")}
    env["TXSTAGE_CACHE_DIR"] = str(cache)
    log = REPO_ROOT / "stage.log"
    try:
        done = subprocess.run(["bash", "-c", "set -e\n" + quick_path() + "wait\n"],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr + log.read_text()
        read = [line for line in done.stdout.splitlines() if line.isdigit()]  # the read's
        assert sorted(read, key=int) == ["1", "4", "9", "16", "25"], done.stdout
        assert "stage.stopped" in log.read_text(), log.read_text()
    finally:
        subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "txstage"), "kafka", "down"],
                       env=env, capture_output=True, timeout=120, check=False)
        log.unlink(missing_ok=True)
