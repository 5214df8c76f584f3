"""A cluster that cannot be reached gives a handful of lines, not a flood: at most
about one line per start-up attempt, then one "cluster unreachable" line and exit 4,
not a config error: the settings may be right and the brokers down (``txstage run``
once printed 2,338 lines in 128 s, ``check-config`` 293 in 15.5 s). A taken metrics
port is said at once, before the cluster is asked. Real CLI processes against a
closed port on 127.0.0.1; no broker.

Takes ≈ 33 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import json
import os
import re
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


def _env(port: int, metrics_port: int) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")}
    return {**clean, "TXSTAGE_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
            "TXSTAGE_GROUP_ID": "unreachable", "TXSTAGE_INPUT_TOPICS": "in",
            "TXSTAGE_OUTPUT_TOPIC": "out", "TXSTAGE_TRANSFORM": "service.examples.square:square",
            "TXSTAGE_METRICS_PORT": str(metrics_port)}


def _start(command: str, port: int, metrics_port: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "service", command], cwd=REPO_ROOT,
                            env=_env(port, metrics_port), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_check_config_against_a_closed_port_is_two_lines_and_exit_4() -> None:
    began = time.monotonic()
    port = _closed_port()
    process = _start("check-config", port)
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - began
    lines = output.splitlines()
    assert process.returncode == 4, output
    # One attempt of up to 15 s (docs/errors.md), plus the interpreter's start.
    assert took < 25, f"{took:.1f} s"
    assert len(lines) == 2, f"{len(lines)} lines:\n{output}"  # librdkafka's, then ours
    assert re.fullmatch(
        rf"txstage: cluster unreachable: cannot query the cluster at TXSTAGE_BOOTSTRAP_SERVERS="
        rf"127\.0\.0\.1:{port} \(asked for 1[56] s\): list_topics: [^\[]+; check the address "
        r"and that the brokers are up", lines[-1]), lines[-1]  # no "[retry]"


def test_a_taken_metrics_port_is_one_line_and_exit_2_before_the_cluster_is_asked() -> None:
    with socket.socket() as holder:  # another replica's metrics port
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        began = time.monotonic()
        process = _start("run", _closed_port(), metrics_port=taken)
        try:
            output, _ = process.communicate(timeout=12)  # not the cluster's 128 s
        finally:
            process.kill()
            process.wait(10)
    assert time.monotonic() - began < 12
    assert process.returncode == 2, output
    assert output.splitlines() == [
        f"txstage: config error: TXSTAGE_METRICS_PORT={taken}: cannot serve /metrics on "
        f"0.0.0.0:{taken}: Address already in use; another process holds it (a second replica "
        f"on this host?): give each replica on a host its own TXSTAGE_METRICS_PORT, or 0 for "
        f"any free port"], output


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
    attempts = [json.loads(line) for line in lines if "startup.cluster_unavailable" in line]
    # Each attempt: its warning, and at most one (folded) librdkafka line.
    assert len(lines) <= 2 * len(attempts) + 2, f"{len(lines)} lines:\n" + "".join(lines)
    # How long it has waited, and how long it will wait more: 120 s in all.
    first = attempts[0]
    assert 10 < first["waited_s"] < 30, first
    assert abs(first["waited_s"] + first["left_s"] - 120) < 0.2, first
    assert not [line for line in lines if '"level": "error"' in line], "".join(lines)
