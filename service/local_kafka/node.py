"""One broker+controller JVM: format its storage, start it, signal it, stop it, read its log.

Every JVM started here (except a detached one, :mod:`service.local_kafka.cli`'s ``up``) dies
with this interpreter: it is registered and SIGKILLed at exit, and when started from the
main thread it also runs under ``setpriv --pdeathsig KILL``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from service.local_kafka.errors import KafkaStartError, LocalKafkaError
from service.local_kafka.jars import log4j_config
from service.local_kafka.properties import HOST

STARTED_LINE = b"Kafka Server started"

# A small box (2 cores) may run three brokers next to the tests: a GC that starts no
# parallel/concurrent worker threads, a fixed heap, and no hsperfdata mmap writes.
JVM_OPTS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:+PerfDisableSharedMem",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)
# The JIT. A test cluster lives for seconds to minutes: C1 alone ("quick") starts a broker
# on about 40 % less CPU, which on 2 cores goes to the tests (three start/kill/restart
# cycles of one node: 23 s of user CPU instead of 39 s; test_stage_cluster_faults: 139 s
# instead of 151 s). A benchmark's broker and a detached node run long enough for C2's
# code to pay off: "full" is the JDK's default, C1 then C2.
JIT_OPTS: dict[str, tuple[str, ...]] = {"quick": ("-XX:TieredStopAtLevel=1",), "full": ()}
# StorageTool runs for a second: C1 only starts it faster.
TOOL_JVM_OPTS: tuple[str, ...] = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")

# Processes started by a Node in this interpreter, killed at exit whatever happens.
_CHILDREN: set[subprocess.Popen[bytes]] = set()
_CHILDREN_LOCK = threading.Lock()


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is not None and candidate.is_file():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise LocalKafkaError("`java` not found (need Java 17+ on PATH or JAVA_HOME)")
    return found


def _classpath(libs: Path) -> str:
    return str(libs / "*")


@dataclass
class Node:
    node_id: int
    broker_port: int
    controller_port: int
    directory: Path
    detached: bool = False
    jit: Literal["quick", "full"] = "full"
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = field(default=False)
    # Behind a proxy: clients are told ``advertised_port``; ``direct_port`` bypasses it.
    advertised_port: int | None = None
    direct_port: int | None = None
    # Secured: the SASL_SSL listener's port.
    secure_port: int | None = None

    @property
    def config(self) -> Path:
        return self.directory / "server.properties"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    @property
    def bootstrap(self) -> str:
        """Where clients connect: the advertised client address (a proxy's, if any)."""
        return f"{HOST}:{self.advertised_port or self.broker_port}"

    @property
    def direct_bootstrap(self) -> str:
        """The node itself, past any proxy."""
        return f"{HOST}:{self.direct_port or self.broker_port}"

    @property
    def secure_bootstrap(self) -> str:
        """The node's SASL_SSL listener (a secured cluster's only)."""
        if self.secure_port is None:
            raise LocalKafkaError(f"node {self.node_id} has no SASL_SSL listener")
        return f"{HOST}:{self.secure_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def format(self, libs: Path, cluster_id: str, quorum_args: Sequence[str]) -> None:
        command = [
            _java(),
            *TOOL_JVM_OPTS,
            f"-Dlog4j2.configurationFile={log4j_config(libs)}",
            "-cp",
            _classpath(libs),
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(self.config),
            *quorum_args,
        ]
        with self.log.open("ab") as out:
            result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
        if result.returncode != 0:
            raise KafkaStartError(
                f"formatting node {self.node_id} failed (exit {result.returncode})\n"
                + tail_file(self.log, 40)
            )

    def start(self, libs: Path) -> int:
        """Start the JVM; return the log offset from which this run's output starts."""
        if self.alive():
            raise LocalKafkaError(f"node {self.node_id} is already running")
        command = [
            _java(),
            *JVM_OPTS,
            *JIT_OPTS[self.jit],
            f"-Dlog4j2.configurationFile={log4j_config(libs)}",
            f"-Dkafka.logs.dir={self.directory}",
            "-cp",
            _classpath(libs),
            "kafka.Kafka",
            str(self.config),
        ]
        # Parent-death signal: the JVM dies even if this interpreter is SIGKILLed. It fires
        # when the *thread* that forked exits, so only from the main thread, never detached.
        setpriv = shutil.which("setpriv")
        if (
            not self.detached
            and setpriv is not None
            and threading.current_thread() is threading.main_thread()
        ):
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            out.write(f"\n==== txstage local_kafka: starting node {self.node_id} ====\n".encode())
            out.flush()
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.directory,
            )
        self.proc = proc
        self.paused = False
        if not self.detached:
            with _CHILDREN_LOCK:
                _CHILDREN.add(proc)
        return offset

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise LocalKafkaError(f"node {self.node_id} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL if it takes longer than ``timeout``."""
        if not self.alive():
            self._forget()
            return
        self.signal(signal.SIGTERM)
        if self.paused:
            self.signal(signal.SIGCONT)  # a stopped JVM cannot act on SIGTERM
        try:
            self._wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._forget()

    def kill(self) -> None:
        if self.alive():
            self.signal(signal.SIGKILL)
            self._wait(30)
        self._forget()

    def _wait(self, timeout: float) -> None:
        assert self.proc is not None
        self.proc.wait(timeout)

    def _forget(self) -> None:
        self.paused = False
        if self.proc is not None:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(self.proc)


def tail_file(path: Path, lines: int) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 256 * lines))
        data = handle.read()
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def wait_for_start(starts: Mapping[int, tuple[Node, int]], deadline: float) -> None:
    """Until every node logs "Kafka Server started" after its start offset (it caught up
    with the metadata log, is unfenced and serving); fails at once if one exits."""
    pending = dict(starts)
    while pending:
        for node_id, (node, offset) in list(pending.items()):
            with node.log.open("rb") as handle:
                handle.seek(offset)
                if STARTED_LINE in handle.read():
                    del pending[node_id]
                    continue
            if not node.alive():
                code = node.proc.returncode if node.proc is not None else None
                raise KafkaStartError(
                    f"node {node_id} exited with {code} before it started\n"
                    + tail_file(node.log, 80)
                )
        if pending and time.monotonic() > deadline:
            tails = "\n".join(tail_file(node.log, 40) for node, _ in pending.values())
            raise KafkaStartError(f"nodes {sorted(pending)} did not start in time\n{tails}")
        if pending:
            time.sleep(0.1)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on 127.0.0.1 a moment ago."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def adopt(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc``'s process group when this interpreter exits (the local registry's
    JVM too)."""
    with _CHILDREN_LOCK:
        _CHILDREN.add(proc)


def release(proc: subprocess.Popen[bytes]) -> None:
    """``proc`` has exited or was stopped: nothing to kill at exit."""
    with _CHILDREN_LOCK:
        _CHILDREN.discard(proc)


@atexit.register
def _kill_children() -> None:
    with _CHILDREN_LOCK:
        children = list(_CHILDREN)
    for proc in children:
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
