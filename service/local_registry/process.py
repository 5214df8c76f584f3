"""One Apicurio Registry JVM: start it, wait until ready, kill it, start it again.

Storage is H2 in a file of the registry's directory (not the default in-memory one), so
a registry killed and started again keeps its schemas and their ids, as a real one does.
Every JVM started here, except a detached one (``txstage registry up``), dies with this
interpreter: it is SIGKILLed at exit, and runs under ``setpriv --pdeathsig KILL`` when
started from the main thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from service.local_kafka.node import adopt, free_ports, release, tail_file
from service.local_kafka.properties import HOST
from service.local_registry.install import RegistryError, find_java, install

CCOMPAT_PATH = "/apis/ccompat/v7"
# Small and quick to start: a test registry serves a few schemas.
JVM_OPTS: tuple[str, ...] = ("-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                             "-XX:+ExitOnOutOfMemoryError", "-XX:+PerfDisableSharedMem")


@dataclass
class Registry:
    """A registry JVM in ``directory`` (its H2 file, its log) on ``port`` (the API) and
    ``management_port`` (health); ports 0 pick free ones at the first start."""

    directory: Path
    port: int = 0
    management_port: int = 0
    detached: bool = False
    proc: subprocess.Popen[bytes] | None = None
    startup_seconds: float = 0.0

    @property
    def url(self) -> str:
        """What confluent-kafka's ``SchemaRegistryClient`` takes as its ``url``."""
        return f"http://{HOST}:{self.port}{CCOMPAT_PATH}"

    @property
    def ready_url(self) -> str:
        return f"http://{HOST}:{self.management_port}/health/ready"

    @property
    def log(self) -> Path:
        return self.directory / "registry.log"

    def command(self, java: str) -> list[str]:
        database = self.directory / "registry-db"
        return [java, *JVM_OPTS,
                f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={self.port}",
                f"-Dquarkus.management.host={HOST}",
                f"-Dquarkus.management.port={self.management_port}",
                # No write delay: a SIGKILL keeps what the registry acknowledged.
                f"-Dapicurio.datasource.url=jdbc:h2:file:{database};WRITE_DELAY=0",
                "-jar", "quarkus-run.jar"]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 120.0) -> Registry:
        """Start the JVM (installing the registry first if needed) and wait until ready."""
        if self.alive():
            raise RegistryError(f"the registry on port {self.port} is already running")
        home, java = install(), find_java()
        if not self.port or not self.management_port:
            self.port, self.management_port = free_ports(2)
        command = self.command(java)
        setpriv = shutil.which("setpriv")
        if not self.detached and setpriv is not None \
                and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        self.directory.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with self.log.open("ab") as out:
            out.write(b"\n==== txstage local_registry: starting ====\n")
            out.flush()
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         cwd=home)
        if not self.detached:
            adopt(self.proc)
        try:
            self.wait_ready(timeout)
        except RegistryError:
            self.kill()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready(self.ready_url):
            if self.proc is not None and self.proc.poll() is not None:
                raise RegistryError(f"the registry exited with {self.proc.returncode} before "
                                    f"it was ready\n{tail_file(self.log, 40)}")
            if time.monotonic() > deadline:
                raise RegistryError(f"the registry was not ready in {timeout:.0f} s\n"
                                    f"{tail_file(self.log, 40)}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL, as a crash would: the next ``start`` uses the same ports and data."""
        self._signal(signal.SIGKILL, 30)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        try:
            self._signal(signal.SIGTERM, timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def _signal(self, sig: signal.Signals, timeout: float) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            proc.wait(timeout)
        if proc is not None and proc.poll() is not None:
            release(proc)

    def close(self) -> None:
        self.kill()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def ready(url: str, timeout: float = 2.0) -> bool:
    """``GET url`` answers 200 (the registry's readiness)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False

