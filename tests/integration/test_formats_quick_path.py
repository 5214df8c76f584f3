"""docs/formats.md's quick path, run verbatim with bash: a fresh broker on 9092, a fresh
registry on 8081 (each in a cache of its own that links the installed jars), the Avro
example through the stage, read back by a plain ``AvroDeserializer``. The harness adds
``set -e`` before the block and a ``wait`` for the stage after it.

Takes ≈ 16 s (a broker and a registry started and stopped).
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from service.local_kafka.jars import install_dir as kafka_install_dir
from service.local_registry.install import install, install_dir
from tests.harness.doc_commands import sh_blocks
from tests.harness.stage import REPO_ROOT

pytestmark = pytest.mark.kafka


def test_the_formats_quick_path_works_verbatim(tmp_path: Path) -> None:
    for port in (9092, 8081, 8091):
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is taken"
    (block,) = sh_blocks("docs/formats.md", "Quick path")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / kafka_install_dir().name).symlink_to(kafka_install_dir())
    (cache / install_dir().name).symlink_to(install())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")}
    env["TXSTAGE_CACHE_DIR"] = str(cache)
    # `txstage` and `python` as the docs' reader has them: this interpreter's venv first.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log = REPO_ROOT / "stage.log"
    try:
        done = subprocess.run(["bash", "-c", "set -e\n" + block + "wait\n"], cwd=REPO_ROOT,
                              env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stdout + done.stderr + \
            (log.read_text() if log.exists() else "")
        read = sorted((ast.literal_eval(line) for line in done.stdout.splitlines()
                       if line.startswith("{'id'")), key=lambda priced: priced["id"])
        assert [(p["id"], p["amount_cents"], p["currency"]) for p in read] == [
            (1, 125, "EUR"), (2, 250, "EUR"), (3, 375, "EUR")], done.stdout
        assert all(p["source"].startswith("orders/") for p in read), done.stdout
        assert "configuration OK" in done.stdout, done.stdout + done.stderr
    finally:
        for tool in ("kafka", "registry"):
            subprocess.run([sys.executable, "-m", "service", tool, "down"], env=env,
                           capture_output=True, timeout=120, check=False)
        log.unlink(missing_ok=True)
