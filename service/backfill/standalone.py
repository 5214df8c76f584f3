"""A Spark standalone cluster on this machine, started with PySpark's own
``bin/spark-class`` (a master and workers, each a JVM on 127.0.0.1): what a backfill
meets on a real cluster — a separate driver, executors in other JVMs — without anything
but the pip-installed PySpark. The tests and ``python -m bench.backfill
--standalone-workers N`` run on it; an operator can try a cluster run the same way.

``with StandaloneSpark(tmp_path, workers=2) as spark: spark.master_url`` — every
process is stopped at exit. Raises RuntimeError (with the logs) if the cluster does not
come up: a test that needs it fails, never skips.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import pyspark

# Where ``service`` is importable from (the repository, or site-packages): executors'
# Python workers need it and the transform's module on their path.
IMPORT_ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandaloneSpark:
    def __init__(self, work_dir: Path, *, workers: int = 1, cores: int = 1,
                 memory: str = "1g") -> None:
        self.work_dir, self.workers, self.cores, self.memory = work_dir, workers, cores, memory
        self.port, self.ui_port = _free_port(), _free_port()
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What the cluster's JVMs and the Python workers they start need: this
        interpreter, and ``service`` (and a transform beside it) importable."""
        path = os.environ.get("PYTHONPATH", "")
        return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
                "PYTHONPATH": os.pathsep.join(p for p in (str(IMPORT_ROOT), path) if p),
                "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
                "SPARK_LOG_DIR": str(self.work_dir), "SPARK_WORKER_DIR": str(self.work_dir)}

    def _start(self, name: str, *args: str) -> None:
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args],
                                env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                cwd=self.work_dir, start_new_session=True)
        log.close()
        self._procs.append((name, proc))

    def state(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return dict(json.load(r))

    def start(self, timeout_s: float = 90.0) -> StandaloneSpark:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        for n in range(self.workers):
            self._start(f"worker{n}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                        "--host", "127.0.0.1", "--cores", str(self.cores),
                        "--memory", self.memory, "--webui-port", str(_free_port()),
                        "--work-dir", str(self.work_dir / f"worker{n}"))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"spark {name} exited {proc.returncode}\n{self.logs()}")
            try:
                alive = [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
            except OSError:
                alive = []
            if len(alive) == self.workers:
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the standalone cluster did not come up in {timeout_s:.0f} s\n"
                           + self.logs())

    def logs(self, lines: int = 40) -> str:
        parts = []
        for path in sorted(self.work_dir.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self) -> None:
        for _, proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self._procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._procs.clear()

    def __enter__(self) -> StandaloneSpark:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
