"""A replica of the stage as a real OS process (``python -m service run``): the one
process helper of the tests (``tests.harness.stage`` re-exports it) and of bench/.

It imports only the standard library and the package's free-port helper, so that
bench/ can use it without the test suite's Kafka clients.
"""

from __future__ import annotations

import json
import os
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
from typing import ClassVar

from service.local_kafka.node import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_RUN = ("-m", "service", "run")


def stage_tree() -> Path:
    """The source tree replicas run from (their cwd, so ``service`` and the test
    transforms are imported from it): this repo, or ``$TXSTAGE_TEST_STAGE_TREE`` to run
    another version of the stage under the same tests, e.g. to show that a regression
    test fails on the code before a fix. That tree needs ``tests/harness/
    transforms.py`` with the transforms the tests name."""
    override = os.environ.get("TXSTAGE_TEST_STAGE_TREE")
    return Path(override).resolve() if override else REPO_ROOT


class Replica:
    """One stage process (or another Python command, for the benchmarks) logging to
    ``log_path``, in a session of its own: a Ctrl-C at the terminal reaches only us (the
    stage would read a second signal as "exit at once"). Two kinds:

    - ``Replica(name, env, log_dir)``, as the tests run it: our environment plus ``env``,
      a free metrics port on 127.0.0.1, unbuffered output, cwd ``stage_tree()``, the log
      (JSON lines) appended to ``log_dir/<name>.log``. Every one started is in
      ``Replica.started`` until ``kill_leftovers`` (after each test) ends it.
    - ``Replica.standalone(name, env, log_path, port, argv)``, as bench/ runs it: exactly
      ``env`` (which names the port), cwd this repo, stdin closed, the log rewritten by
      each start unless ``append``, and SIGKILLed by the kernel if we die without
      cleaning up (parent-death signal, via ``setpriv``). Not in ``started``.
    """

    started: ClassVar[list[Replica]] = []

    @classmethod
    def kill_leftovers(cls) -> list[str]:
        """SIGKILL every replica still running; the names of those that were."""
        running = [replica for replica in cls.started if replica.alive()]
        for replica in running:
            replica.kill()
        cls.started.clear()
        return [replica.name for replica in running]

    def __init__(self, name: str, env: Mapping[str, str], log_dir: Path) -> None:
        port = free_ports(1)[0]
        self._configure(name, {**os.environ, **env, "TXSTAGE_METRICS_PORT": str(port),
                               "TXSTAGE_METRICS_HOST": "127.0.0.1", "PYTHONUNBUFFERED": "1"},
                        log_dir / f"{name}.log", port, SERVICE_RUN, standalone=False)

    @classmethod
    def standalone(cls, name: str, env: Mapping[str, str], log_path: Path, port: int,
                   argv: Sequence[str] = SERVICE_RUN) -> Replica:
        """``python <argv>`` with exactly ``env``; ``port`` is where its HTTP answers."""
        replica = cls.__new__(cls)
        replica._configure(name, dict(env), log_path, port, argv, standalone=True)
        return replica

    def _configure(self, name: str, env: dict[str, str], log_path: Path, port: int,
                   argv: Sequence[str], *, standalone: bool) -> None:
        self.name = name
        self.port = port
        self.env = env
        self.log_path = log_path
        self.argv = [sys.executable, *argv]
        self.proc: subprocess.Popen[bytes] | None = None
        self._standalone = standalone
        self._stop_requested = False

    def start(self, *, append: bool = False) -> Replica:
        """Launch it. A test replica always appends to its log (a restarted one keeps
        its earlier lines) and joins ``started``; a standalone one rewrites its log
        unless ``append``."""
        self._stop_requested = False
        command: list[str] = self.argv
        stdin: int | None = None
        if self._standalone:
            setpriv = shutil.which("setpriv")
            if setpriv and threading.current_thread() is threading.main_thread():
                command = [setpriv, "--pdeathsig", "KILL", "--", *command]
            stdin, cwd, mode = subprocess.DEVNULL, REPO_ROOT, "ab" if append else "wb"
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        else:
            cwd, mode = stage_tree(), "ab"
        with self.log_path.open(mode) as log:
            self.proc = subprocess.Popen(command, cwd=cwd, env=self.env, stdin=stdin,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        if not self._standalone:
            Replica.started.append(self)
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
