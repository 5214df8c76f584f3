"""A cluster that cannot be reached gives a handful of lines, not a flood: at most
about one line per start-up attempt, then one config-error line and exit 2
(issue 31: ``txstage run`` printed 2,338 lines in 128 s, ``check-config`` 293 in
15.5 s). Real CLI processes against a closed port on 127.0.0.1; no broker.

Takes ≈ 33 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env(port: int) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")}
    return {**clean, "TXSTAGE_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
            "TXSTAGE_GROUP_ID": "unreachable", "TXSTAGE_INPUT_TOPICS": "in",
            "TXSTAGE_OUTPUT_TOPIC": "out", "TXSTAGE_TRANSFORM": "service.examples.square:square",
            "TXSTAGE_METRICS_PORT": "0"}


def _start(command: str, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "service", command], cwd=REPO_ROOT,
                            env=_env(port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_check_config_against_a_closed_port_is_two_lines_and_exit_2() -> None:
    began = time.monotonic()
    process = _start("check-config", _closed_port())
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - began
    lines = output.splitlines()
    assert process.returncode == 2, output
    # One attempt of up to 15 s (docs/errors.md), plus the interpreter's start.
    assert took < 25, f"{took:.1f} s"
    assert len(lines) <= 3, f"{len(lines)} lines:\n{output}"
    assert "cannot query the cluster at TXSTAGE_BOOTSTRAP_SERVERS=127.0.0.1:" in lines[-1]


def test_run_against_a_closed_port_logs_about_one_line_per_attempt() -> None:
    process = _start("run", _closed_port())
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        lines.extend(process.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    try:
        # Attempts end about every 16 s (each waits up to 15 s for an answer, then 1 s).
        while not any("startup.cluster_unavailable" in line for line in lines):
            assert process.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
    finally:
        process.kill()
        process.wait(10)
        reader.join(10)
    attempts = sum("startup.cluster_unavailable" in line for line in lines)
    # Each attempt: its warning, and at most one (folded) librdkafka line.
    assert len(lines) <= 2 * attempts + 2, f"{len(lines)} lines:\n" + "".join(lines)
    assert not [line for line in lines if '"level": "error"' in line], "".join(lines)
