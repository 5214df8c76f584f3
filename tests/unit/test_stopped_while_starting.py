"""A signal while the stage is still starting: SIGTERM or SIGINT ends it with exit 0
(chaos seed 11: a replica that joined right after a broker pause was told to leave 6 s
later, still in its start-up checks, and died by the signal: exit -15, "not caused by a
fault"); SIGUSR1 prints every thread's stack and the replica goes on waiting (a CI
run's diagnosis, SIGUSR1 to every live replica, killed one still in its checks).

No broker: the bootstrap is a closed port, so start-up waits in its checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.kafka import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def starting(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A ``txstage run`` in its start-up checks (it has tried to connect), and its log."""
    log_path = tmp_path / "stage.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "TXSTAGE_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_ports(1)[0]}",
           "TXSTAGE_GROUP_ID": "g", "TXSTAGE_INPUT_TOPICS": "in",
           "TXSTAGE_OUTPUT_TOPIC": "out", "TXSTAGE_TRANSFORM": "service.examples.square:square",
           "TXSTAGE_METRICS_PORT": str(free_ports(1)[0])}
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service", "run"], cwd=REPO_ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "Connection refused" not in log_path.read_text():  # in its checks
            assert proc.poll() is None, log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, "no connection attempt in 30 s"
            time.sleep(0.05)
        yield proc, log_path
    finally:
        if proc.poll() is None:
            proc.kill()


def _events(log_path: Path) -> list[object]:
    return [json.loads(line).get("event") for line in log_path.read_text().splitlines()
            if line.startswith("{")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_start_up_checks_exits_0(
        sig: signal.Signals, starting: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, log_path = starting
    proc.send_signal(sig)
    code = proc.wait(15)
    assert code == 0, f"exit {code}\n" + log_path.read_text()[-2000:]
    assert "stage.stopped_while_starting" in _events(log_path)


def test_sigusr1_during_the_start_up_checks_prints_the_stacks_and_the_wait_goes_on(
        starting: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, log_path = starting
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while "check_cluster" not in log_path.read_text():  # a stack through the checks
        assert proc.poll() is None, f"SIGUSR1 ended it: exit {proc.returncode}\n" \
            + log_path.read_text()[-2000:]
        assert time.monotonic() < deadline, "no stacks 10 s after SIGUSR1"
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, log_path.read_text()[-2000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
