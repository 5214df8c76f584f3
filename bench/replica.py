"""A stage as a real OS process (``python -m service run``, or another Python command):
the process helper of bench/, and the base of the tests' ``tests.harness.replica``.

It imports only the standard library, so that it ships in the wheel with bench/ and
needs nothing of the test suite.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVICE_RUN = ("-m", "service", "run")


class Replica:
    """One process: ``python <argv>`` with exactly ``env`` (which names ``port``, where
    its HTTP answers), cwd this repo, stdin closed, logging to ``log_path`` (rewritten by
    each start unless ``append``), in a session of its own: a Ctrl-C at the terminal
    reaches only us (the stage would read a second signal as "exit at once"). The kernel
    SIGKILLs it if we die without cleaning up (parent-death signal, via ``setpriv``).
    """

    def __init__(self, name: str, env: Mapping[str, str], log_path: Path, port: int,
                 argv: Sequence[str] = SERVICE_RUN) -> None:
        self.name = name
        self.port = port
        self.env = dict(env)
        self.log_path = log_path
        self.argv = [sys.executable, *argv]
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop_requested = False

    def start(self, *, append: bool = False) -> Self:
        """Launch it; the log is rewritten unless ``append``."""
        command: list[str] = self.argv
        setpriv = shutil.which("setpriv")
        if setpriv and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        return self._launch(command, REPO_ROOT, subprocess.DEVNULL, "ab" if append else "wb")

    def _launch(self, command: Sequence[str], cwd: Path, stdin: int | IO[bytes] | None,
                mode: str) -> Self:
        self._stop_requested = False
        with self.log_path.open(mode) as log:
            self.proc = subprocess.Popen(command, cwd=cwd, env=self.env, stdin=stdin,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM and wait: the exit code (``subprocess.TimeoutExpired`` after
        ``timeout``)."""
        self.signal(signal.SIGTERM)
        assert self.proc is not None
        return self.proc.wait(timeout)

    def request_stop(self) -> None:
        """Send SIGTERM once: the stage reads a second one as "exit at once, commit nothing"."""
        if self.alive() and not self._stop_requested:
            self._stop_requested = True
            self.signal(signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM once (the stage commits and exits 0), SIGKILL after ``timeout``: the
        exit code (0 if it never started)."""
        if self.proc is None:
            return 0
        self.request_stop()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.alive():
            self.signal(signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(10)

    def get(self, path: str, timeout: float = 2) -> tuple[int, str]:
        """``(status, body)`` of an HTTP GET on the replica's port; OSError if it does
        not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                        timeout=timeout) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def answer(self, path: str, timeout: float = 2) -> tuple[int, str] | None:
        """``get``, None if the replica does not answer."""
        try:
            return self.get(path, timeout)
        except OSError:
            return None

    def ready(self) -> bool:
        answer = self.answer("/readyz")
        return answer is not None and answer[0] == 200

    def metrics(self) -> str:
        """The /metrics body whatever its status; OSError if the replica does not answer."""
        return self.get("/metrics")[1]

    def scrape(self) -> str:
        """The /metrics page; "" unless the replica answers it with 200."""
        answer = self.answer("/metrics")
        return answer[1] if answer is not None and answer[0] == 200 else ""

    def wait_ready(self, timeout: float, interval: float = 0.05) -> float:
        """Seconds until /readyz answers 200; raises if the process exits or time runs out."""
        started = time.monotonic()
        while not self.ready():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.returncode()} before it was "
                                   f"ready\n{self.log_excerpt()}")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s\n"
                                   f"{self.log_excerpt()}")
            time.sleep(interval)
        return time.monotonic() - started

    def log_lines(self) -> list[dict[str, object]]:
        lines = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                lines.append({"event": "<not json>", "raw": raw})
        return lines

    def events(self, name: str) -> list[dict[str, object]]:
        return [line for line in self.log_lines() if line.get("event") == name]

    def diagnosis(self, lines: int = 40) -> str:
        """The log without connection noise: why the stage failed if it did, its last
        ``lines`` lines, then the last thread dump and partition states (SIGUSR1) if
        there were any."""
        text = self.log_path.read_text(errors="replace").splitlines()
        noise = ("kafka_client_error", "Connect to ipv4", "brokers are down")
        quiet = [line for line in text if not any(n in line for n in noise)]
        dump_at = max((i for i, line in enumerate(text)
                       if line.startswith(("Thread 0x", "Current thread 0x"))), default=None)
        parts = quiet[-lines:]
        failed = [line for line in text if '"event": "stage.failed"' in line]
        if failed:  # first: a long tail is often cut in the middle where it is shown
            parts = ["--- why it failed", *failed, "--- the log's end", *parts]
        if dump_at is not None:
            start = dump_at
            while start > 0 and (not text[start - 1] or text[start - 1].startswith(
                    ("Thread 0x", "Current thread", "  File "))):
                start -= 1
            parts += ["--- thread stacks (SIGUSR1)", *text[start:dump_at + 200]]
        return "\n".join(parts)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_excerpt(self, lines: int = 30) -> str:
        """The log's last ``lines`` under a ``--- name: path`` line, for an error message;
        says so when there is no log."""
        if not self.log_path.exists():
            return f"({self.log_path} does not exist)"
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join([f"--- {self.name}: {self.log_path}", *text])
