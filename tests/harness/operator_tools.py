"""Helpers of the operator-tool tests (test_audit.py, test_redrive.py): running a tool as
an operator does, and a foreign transaction left open on an output partition."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.harness.stage import REPO_ROOT, StageSetup


def tool(setup: StageSetup, *args: str, env: dict[str, str] | None = None
         ) -> tuple[int, dict[str, object], str]:
    """``txstage <args> --json`` with the stage's settings (and ``env``): the exit code,
    the JSON report ({} if none) and stderr."""
    result = subprocess.run([sys.executable, "-m", "service", *args, "--json"], cwd=REPO_ROOT,
                            env={**os.environ, **setup.env, **(env or {})},
                            capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}
    return result.returncode, report, result.stderr


def violations(report: dict[str, object]) -> dict[str, int]:
    """An audit report's violation counts, the kinds found only."""
    found = report["violations"]
    assert isinstance(found, dict)
    return {kind: v["count"] for kind, v in found.items() if v["count"]}


_FOREIGN = """
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[3]})
p.init_transactions(30)
p.begin_transaction()
p.produce(sys.argv[2], b"held", b"k", partition=1)
p.flush(30)
print("open", flush=True)
time.sleep(600)
"""


@contextmanager
def foreign_transaction(setup: StageSetup) -> Iterator[None]:
    """A foreign producer's transaction open on partition 1 of the output topic, the
    producer stopped (SIGSTOP) so it neither commits nor aborts; killed at the end."""
    foreign = subprocess.Popen([sys.executable, "-c", _FOREIGN, setup.bootstrap,
                                setup.output_topic, f"foreign-{setup.group_id}"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert foreign.stdout is not None and foreign.stdout.readline().strip() == "open"
        foreign.send_signal(signal.SIGSTOP)
        yield
    finally:
        foreign.kill()
        foreign.wait(10)
