"""A real Apache Kafka broker (KRaft) for tests and local development.

The broker is resolved from Maven Central (``deploy/local/pom.xml``) into a cache outside the
work tree and run as plain JVM processes, one per node, each a combined broker+controller.

- :func:`install` puts the jars in ``$TXSTAGE_CACHE_DIR`` (default ``~/.cache/txstage``).
- :class:`KafkaCluster` starts 1 or 3 nodes on free ports in a fresh temp dir, waits until
  they serve transactions and consumer groups, and lets tests stop, kill, pause, resume and
  restart single nodes. Every process it starts dies with it (context manager, atexit, and
  a parent-death signal when started from the main thread).
- ``python -m tests.harness.kafka install|up|down|status`` is the CLI behind
  ``make kafka-up`` / ``make kafka-down``: one detached node on 127.0.0.1:9092.

Reading helpers (``read_committed`` …) live in :mod:`tests.harness.reading` and are
re-exported here.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from service.cache import cache_root, install_once, installed
from tests.harness.reading import (
    ReadRecord,
    committed_offsets,
    end_offsets,
    read_committed,
    read_topic,
    read_uncommitted,
)

__all__ = [
    "KAFKA_VERSION",
    "KafkaCluster",
    "KafkaHarnessError",
    "KafkaService",
    "KafkaStartError",
    "ReadRecord",
    "RunningKafka",
    "broker_properties",
    "cache_root",
    "committed_offsets",
    "end_offsets",
    "install",
    "read_committed",
    "read_topic",
    "read_uncommitted",
]

KAFKA_VERSION = "4.1.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
POM = REPO_ROOT / "deploy" / "local" / "pom.xml"
LOG4J_CONFIG = REPO_ROOT / "deploy" / "local" / "log4j2.properties"

_STARTED_LINE = b"Kafka Server started"
_HOST = "127.0.0.1"

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
# StorageTool runs for a second: C1 only starts it faster.
TOOL_JVM_OPTS: tuple[str, ...] = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


class KafkaHarnessError(RuntimeError):
    """The local broker could not be installed, started or stopped."""


class KafkaStartError(KafkaHarnessError):
    """A node did not become ready; the message ends with the broker's log tail."""


class KafkaService(Protocol):
    """What the test fixtures hand out: a broker to talk to, and its logs for failures."""

    @property
    def bootstrap(self) -> str: ...

    def log_tail(self, lines: int = 80) -> str: ...


@dataclass(frozen=True)
class RunningKafka:
    """A broker the harness did not start (``TXSTAGE_TEST_BOOTSTRAP``): no logs, no faults."""

    bootstrap: str

    def log_tail(self, lines: int = 80) -> str:
        return f"(external broker at {self.bootstrap}: its logs are not available here)"


# --------------------------------------------------------------------------------- install


def install_dir() -> Path:
    return cache_root() / f"kafka-{KAFKA_VERSION}"


def _install_fingerprint() -> str:
    digest = hashlib.sha256()
    for source in (POM, LOG4J_CONFIG):
        digest.update(source.read_bytes())
    return digest.hexdigest()


def install(*, quiet: bool = True) -> Path:
    """Resolve the broker's jars if missing and return the ``libs`` directory.

    Idempotent (a marker holding the hash of the POM and log config says the install is
    complete and current) and atomic (Maven copies into a temp dir that is renamed into
    place). A file lock serialises concurrent installs from parallel test runs.
    """
    target = install_dir()
    fingerprint = _install_fingerprint()
    if installed(target, fingerprint):
        return target / "libs"
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaHarnessError("`mvn` not found on PATH: Maven is needed to resolve Kafka jars")

    def build(staging: Path) -> None:
        _resolve_jars(mvn, staging / "libs", quiet=quiet)
        shutil.copy2(LOG4J_CONFIG, staging / "log4j2.properties")

    install_once(target, fingerprint, build, lock_name=f".kafka-{KAFKA_VERSION}.lock")
    return target / "libs"


def _resolve_jars(mvn: str, libs: Path, *, quiet: bool) -> None:
    command = [
        mvn,
        "-B",
        *(["-q"] if quiet else []),
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise KafkaHarnessError(f"Maven could not resolve Kafka {KAFKA_VERSION}:\n{output}")
    if not (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
        raise KafkaHarnessError(f"Maven finished but kafka_2.13-{KAFKA_VERSION}.jar is missing")


def kafka_uuid() -> str:
    """A random Kafka ``Uuid`` string (cluster and directory ids): url-safe base64, 22 chars."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # would read as a CLI flag; Kafka avoids them too
            return text


def broker_properties(
    *,
    node_id: int,
    broker_port: int,
    controller_port: int,
    controller_ports: Mapping[int, int],
    log_dir: Path,
    overrides: Mapping[str, str | int] | None = None,
) -> dict[str, str]:
    """``server.properties`` of one combined broker+controller node.

    ``controller_ports`` maps every node id of the cluster to its controller port. One node
    forms a dynamic quorum (formatted ``--standalone``), several nodes one formatted with
    ``--initial-controllers``; both are found through ``controller.quorum.bootstrap.servers``.
    """
    replicas = len(controller_ports)
    min_isr = 1 if replicas == 1 else 2
    quorum = ",".join(f"{_HOST}:{port}" for _, port in sorted(controller_ports.items()))
    props: dict[str, str | int] = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "listeners": f"PLAINTEXT://{_HOST}:{broker_port},CONTROLLER://{_HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{_HOST}:{broker_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.bootstrap.servers": quorum,
        "log.dirs": str(log_dir),
        # Topics exist only when a test creates them.
        "auto.create.topics.enable": "false",
        "num.partitions": 1,
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        # Tests use short sessions (zombies) and must not wait for timed-out transactions.
        "group.initial.rebalance.delay.ms": 0,
        "group.min.session.timeout.ms": 1000,
        "group.consumer.min.session.timeout.ms": 1000,
        "group.consumer.min.heartbeat.interval.ms": 500,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
        # Sized for a small box: 128 MB of dedupe buffer per broker is most of a 512 MB heap.
        "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
        "num.network.threads": 2,
        "num.io.threads": 4,
        "background.threads": 4,
        "num.recovery.threads.per.data.dir": 1,
        # A killed node is fenced (its leaderships move) after 3 s instead of 9 s, and may
        # register again after a SIGKILL+restart that soon (DUPLICATE_BROKER_REGISTRATION
        # until the old session expires, even on a single node).
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 3000,
    }
    props.update(overrides or {})
    return {key: str(value) for key, value in props.items()}


def _write_properties(path: Path, props: Mapping[str, str]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in props.items()))


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on 127.0.0.1 a moment ago."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((_HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is not None and candidate.is_file():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise KafkaHarnessError("`java` not found (need Java 17+ on PATH or JAVA_HOME)")
    return found


def _classpath(libs: Path) -> str:
    return str(libs / "*")


def _log4j_config(libs: Path) -> Path:
    installed = libs.parent / "log4j2.properties"
    return installed if installed.is_file() else LOG4J_CONFIG


# ----------------------------------------------------------------------------------- nodes

# Processes started by a KafkaCluster in this interpreter, killed at exit whatever happens.
_CHILDREN: set[subprocess.Popen[bytes]] = set()
_CLUSTERS: set[KafkaCluster] = set()
_REGISTRY_LOCK = threading.Lock()


@dataclass
class _Node:
    node_id: int
    broker_port: int
    controller_port: int
    directory: Path
    detached: bool = False
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = field(default=False)

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
        return f"{_HOST}:{self.broker_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def format(self, libs: Path, cluster_id: str, quorum_args: Sequence[str]) -> None:
        command = [
            _java(),
            *TOOL_JVM_OPTS,
            f"-Dlog4j2.configurationFile={_log4j_config(libs)}",
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
            raise KafkaHarnessError(f"node {self.node_id} is already running")
        command = [
            _java(),
            *JVM_OPTS,
            f"-Dlog4j2.configurationFile={_log4j_config(libs)}",
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
            out.write(f"\n==== txstage harness: starting node {self.node_id} ====\n".encode())
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
            with _REGISTRY_LOCK:
                _CHILDREN.add(proc)
        return offset

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise KafkaHarnessError(f"node {self.node_id} is not running")
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
            with _REGISTRY_LOCK:
                _CHILDREN.discard(self.proc)


_WORKDIR_PREFIX = "txstage-kafka-"
_STALE_AFTER_SECONDS = 15 * 60


def sweep_stale_workdirs(parent: Path | None = None) -> list[Path]:
    """Remove cluster temp dirs left by interpreters that were SIGKILLed (their JVMs died
    with them): older than 15 minutes and referenced by no live process's command line."""
    root = Path(parent or tempfile.gettempdir())
    candidates = [
        path
        for path in root.glob(f"{_WORKDIR_PREFIX}*")
        if path.is_dir() and time.time() - path.stat().st_mtime > _STALE_AFTER_SECONDS
    ]
    if not candidates:
        return []
    in_use = b"\0".join(_cmdlines())
    stale = [path for path in candidates if str(path).encode() not in in_use]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _cmdlines() -> Iterator[bytes]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                yield (entry / "cmdline").read_bytes()


def tail_file(path: Path, lines: int) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 256 * lines))
        data = handle.read()
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _wait_for_start(starts: Mapping[int, tuple[_Node, int]], deadline: float) -> None:
    """Until every node logs "Kafka Server started" after its start offset (it caught up
    with the metadata log, is unfenced and serving); fails at once if one exits."""
    pending = dict(starts)
    while pending:
        for node_id, (node, offset) in list(pending.items()):
            with node.log.open("rb") as handle:
                handle.seek(offset)
                if _STARTED_LINE in handle.read():
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


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((_HOST, port)) == 0


# ----------------------------------------------------------------------------- readiness


def _broker_ids(bootstrap: str, timeout: float) -> set[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    description = admin.describe_cluster(request_timeout=timeout).result(timeout + 1)
    return {node.id for node in description.nodes}


def wait_ready(
    bootstrap: str,
    *,
    broker_ids: set[int] | None = None,
    timeout: float = 60.0,
    probe_id: str | None = None,
) -> None:
    """Until the cluster lists ``broker_ids`` and serves transactions and consumer groups.

    Serving transactions means ``init_transactions`` succeeds (the ``__transaction_state``
    topic exists and its coordinator is loaded), and groups that an OffsetFetch answers
    (``__consumer_offsets`` likewise). Raises :class:`TimeoutError` with the last error.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"Kafka at {bootstrap} not ready: {last_error!r}")
        return left

    while broker_ids is not None:
        try:
            seen = _broker_ids(bootstrap, min(5.0, remaining()))
            if broker_ids <= seen:
                break
            last_error = KafkaHarnessError(f"brokers {sorted(seen)}, want {sorted(broker_ids)}")
        except (KafkaException, TimeoutError) as exc:
            last_error = exc
        time.sleep(0.2)
    transactional_id = probe_id or f"txstage-harness-probe-{uuid.uuid4().hex[:8]}"
    quiet = {"bootstrap.servers": bootstrap, "log_level": 0}  # errors are expected here

    def transactions() -> None:
        nonlocal last_error
        while True:
            producer = Producer({**quiet, "transactional.id": transactional_id})
            try:
                producer.init_transactions(min(10.0, remaining()))
                return
            except KafkaException as exc:
                last_error = exc
                time.sleep(0.1)
            finally:
                with contextlib.suppress(KafkaException):
                    producer.close()

    def groups() -> None:
        nonlocal last_error
        consumer = Consumer(
            {
                **quiet,
                "group.id": f"{transactional_id}-group",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        try:
            while True:
                try:
                    probe = [TopicPartition("__txstage_probe", 0)]
                    consumer.committed(probe, min(10.0, remaining()))
                    return
                except KafkaException as exc:
                    last_error = exc
                    time.sleep(0.1)
        finally:
            consumer.close()

    # Both create and load an internal topic (50 partitions each): in parallel.
    _run_parallel([transactions, groups])


# --------------------------------------------------------------------------------- cluster


class KafkaCluster:
    """1 or 3 combined broker+controller nodes on 127.0.0.1, in a temp dir of their own.

    Node ids are ``0 .. nodes-1`` and are the ``i`` of :meth:`stop`, :meth:`kill`, … (the
    same ids Kafka reports as partition leaders). Use as a context manager::

        with KafkaCluster(nodes=3) as cluster:
            cluster.kill(leader)
            ...
            cluster.restart(leader)
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        overrides: Mapping[str, str | int] | None = None,
        startup_timeout: float = 90.0,
        workdir: Path | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = nodes
        self.overrides = dict(overrides or {})
        self.startup_timeout = startup_timeout
        self._parent = workdir
        self.workdir = Path()
        self.libs = Path()
        self.nodes: list[_Node] = []
        self.cluster_id = ""
        self.startup_seconds = 0.0

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> KafkaCluster:
        return self if self.nodes else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self, *, attempts: int = 3) -> KafkaCluster:
        """Install if needed, format and start every node, wait until the cluster is ready.

        A port taken between choosing it and the JVM binding it is retried on new ports.
        """
        if self.nodes:
            raise KafkaHarnessError(f"{self!r} was started already")
        began = time.monotonic()
        self.libs = install()
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
                break
            except KafkaStartError as exc:
                self.close()
                if "Address already in use" not in str(exc) or attempt == attempts:
                    raise
                self.nodes = []
            except BaseException:
                self.close()
                raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _start_once(self) -> None:
        with _REGISTRY_LOCK:
            _CLUSTERS.add(self)
        sweep_stale_workdirs(self._parent)
        self.workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX, dir=self._parent))
        ports = free_ports(2 * self.size)
        controller_ports = {i: ports[2 * i + 1] for i in range(self.size)}
        self.nodes = [
            _Node(i, ports[2 * i], ports[2 * i + 1], self.workdir / f"node-{i}")
            for i in range(self.size)
        ]
        self.cluster_id = kafka_uuid()
        for node in self.nodes:
            node.directory.mkdir(parents=True)
            _write_properties(
                node.config,
                broker_properties(
                    node_id=node.node_id,
                    broker_port=node.broker_port,
                    controller_port=node.controller_port,
                    controller_ports=controller_ports,
                    log_dir=node.data,
                    overrides=self.overrides,
                ),
            )
        quorum_args = self._quorum_args()
        _run_parallel(
            [partial(node.format, self.libs, self.cluster_id, quorum_args) for node in self.nodes]
        )
        deadline = time.monotonic() + self.startup_timeout
        starts = {node.node_id: (node, node.start(self.libs)) for node in self.nodes}
        _wait_for_start(starts, deadline)
        self._wait_ready(deadline)

    def _quorum_args(self) -> list[str]:
        if self.size == 1:
            return ["--standalone"]
        voters = ",".join(
            f"{node.node_id}@{_HOST}:{node.controller_port}:{kafka_uuid()}" for node in self.nodes
        )
        return ["--initial-controllers", voters]

    def _wait_ready(self, deadline: float) -> None:
        running = {node.node_id for node in self.nodes if node.alive() and not node.paused}
        try:
            wait_ready(
                self.bootstrap,
                broker_ids=running,
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except TimeoutError as exc:
            raise KafkaStartError(f"{exc}\n{self.log_tail()}") from exc

    def close(self) -> None:
        """Kill every node and remove the temp dir. Safe to call twice."""
        self._kill_all()
        if self.workdir != Path() and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)
        with _REGISTRY_LOCK:
            _CLUSTERS.discard(self)

    def _kill_all(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(KafkaHarnessError, subprocess.TimeoutExpired):
                node.kill()

    # -- addresses ---------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's broker address, comma-separated (stable across restarts)."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.nodes]

    def node_bootstrap(self, i: int) -> str:
        return self._node(i).bootstrap

    def log_path(self, i: int) -> Path:
        return self._node(i).log

    def pid(self, i: int) -> int | None:
        proc = self._node(i).proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def is_running(self, i: int) -> bool:
        """The JVM of node ``i`` exists (it may be paused)."""
        return self._node(i).alive()

    def is_paused(self, i: int) -> bool:
        return self._node(i).paused

    def _node(self, i: int) -> _Node:
        if not 0 <= i < len(self.nodes):
            raise IndexError(f"no node {i}; node ids are {self.node_ids}")
        return self.nodes[i]

    # -- faults ------------------------------------------------------------------------

    def stop(self, i: int, timeout: float = 30.0) -> None:
        """SIGTERM node ``i`` and wait for it to exit (SIGKILL after ``timeout`` s)."""
        self._node(i).stop(timeout)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` and reap it."""
        self._node(i).kill()

    def pause(self, i: int) -> None:
        """SIGSTOP node ``i``: it keeps its sockets open but answers nothing."""
        node = self._node(i)
        node.signal(signal.SIGSTOP)
        node.paused = True

    def resume(self, i: int) -> None:
        """SIGCONT node ``i``."""
        node = self._node(i)
        node.signal(signal.SIGCONT)
        node.paused = False

    def restart(self, i: int, timeout: float | None = None) -> None:
        """Start node ``i`` again on the same data dir and ports, wait until it is ready.

        A running node is stopped first (SIGTERM). Ready means the node logged "Kafka Server
        started" (it caught up with the metadata log and is unfenced) and the cluster serves
        transactions and groups again.
        """
        node = self._node(i)
        if node.alive():
            node.stop(30.0)
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        _wait_for_start({i: (node, node.start(self.libs))}, deadline)
        self._wait_ready(deadline)

    def heal(self, timeout: float | None = None) -> None:
        """Resume paused nodes and restart dead ones, then wait until all serve again, so
        the next test gets a whole cluster. Does nothing to a whole, running cluster."""
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        resumed = [node for node in self.nodes if node.alive() and node.paused]
        for node in resumed:
            self.resume(node.node_id)
        for node in self.nodes:
            if not node.alive():
                self.restart(node.node_id, timeout)
        if resumed:
            self._wait_ready(deadline)

    # -- logs --------------------------------------------------------------------------

    def log_tail(self, lines: int = 80) -> str:
        """The last ``lines`` lines of every node's log (format output, JVM and log4j)."""
        parts = []
        for node in self.nodes:
            state = "paused" if node.paused else ("running" if node.alive() else "down")
            parts.append(f"==== node {node.node_id} ({state}) {node.log} ====")
            parts.append(tail_file(node.log, lines))
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"KafkaCluster(nodes={self.size}, bootstrap={self.bootstrap!r})"


def _run_parallel(tasks: Sequence[Callable[[], None]]) -> None:
    """Run callables in threads; re-raise the first error."""
    errors: list[BaseException] = []

    def run(task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@atexit.register
def _kill_children() -> None:
    with _REGISTRY_LOCK:
        clusters = list(_CLUSTERS)
        children = list(_CHILDREN)
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.close()
    for proc in children:
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# ------------------------------------------------------------------------------------- CLI

LOCAL_BROKER_PORT = 9092
LOCAL_CONTROLLER_PORT = 9093


def local_broker_dir() -> Path:
    return cache_root() / "local-broker"


def _local_node(port: int, controller_port: int) -> _Node:
    return _Node(0, port, controller_port, local_broker_dir(), detached=True)


def _pid_file() -> Path:
    return local_broker_dir() / "broker.pid"


def _local_pids() -> list[int]:
    """Live JVMs started by ``up`` (found by command line, so a lost pid file is no excuse)."""
    needle = str(local_broker_dir() / "server.properties").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"kafka.Kafka" in cmdline and needle in cmdline.split(b"\0"):
            pids.append(int(entry.name))
    return sorted(pids)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited: only its exit status is left.
    with contextlib.suppress(OSError):
        if (Path("/proc") / str(pid) / "stat").read_text().split()[2] == "Z":
            return False
    return True


def _cmd_install(_: argparse.Namespace) -> int:
    began = time.monotonic()
    libs = install(quiet=True)
    print(f"Kafka {KAFKA_VERSION}: {libs} ({time.monotonic() - began:.1f} s)")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    node = _local_node(args.port, args.controller_port)
    pids = _local_pids()
    if pids:
        try:
            wait_ready(
                node.bootstrap, broker_ids={0}, timeout=args.timeout, probe_id="txstage-local-probe"
            )
        except (TimeoutError, KafkaException) as exc:
            print(f"local Kafka (pid {pids[0]}) is running but not ready: {exc}", file=sys.stderr)
            print(tail_file(node.log, 40), file=sys.stderr)
            return 1
        print(f"Kafka {KAFKA_VERSION} already up (pid {pids[0]})")
        _print_location(node)
        return 0
    for port in (args.port, args.controller_port):
        if _port_open(port):
            print(f"127.0.0.1:{port} is taken by another process; not starting", file=sys.stderr)
            return 1
    libs = install()
    node.directory.mkdir(parents=True, exist_ok=True)
    _write_properties(
        node.config,
        broker_properties(
            node_id=0,
            broker_port=args.port,
            controller_port=args.controller_port,
            controller_ports={0: args.controller_port},
            log_dir=node.data,
        ),
    )
    if not (node.data / "meta.properties").exists():
        node.format(libs, kafka_uuid(), ["--standalone"])
    began = time.monotonic()
    offset = node.start(libs)
    assert node.proc is not None
    _pid_file().write_text(f"{node.proc.pid}\n")
    try:
        _wait_for_start({0: (node, offset)}, time.monotonic() + args.timeout)
        wait_ready(
            node.bootstrap, broker_ids={0}, timeout=args.timeout, probe_id="txstage-local-probe"
        )
    except (KafkaStartError, TimeoutError, KafkaException) as exc:
        node.kill()
        _pid_file().unlink(missing_ok=True)
        print(f"local Kafka did not start: {exc}", file=sys.stderr)
        print(tail_file(node.log, 40), file=sys.stderr)
        return 1
    print(f"Kafka {KAFKA_VERSION} up in {time.monotonic() - began:.1f} s (pid {node.proc.pid})")
    _print_location(node)
    return 0


def _print_location(node: _Node) -> None:
    print(f"bootstrap: {node.bootstrap}")
    print(f"log:       {node.log}")


def _cmd_down(args: argparse.Namespace) -> int:
    pids = _local_pids()
    if not pids:
        _pid_file().unlink(missing_ok=True)
        print("local Kafka is not running")
        return 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.grace
    while any(_pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    forced = [pid for pid in pids if _pid_alive(pid)]
    for pid in forced:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while any(_pid_alive(pid) for pid in forced):
        time.sleep(0.05)
    _pid_file().unlink(missing_ok=True)
    how = f"killed after {args.grace:.0f} s" if forced else "stopped"
    print(f"local Kafka {how} (pid {', '.join(map(str, pids))})")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    node = _local_node(args.port, args.controller_port)
    pids = _local_pids()
    if not pids:
        print("local Kafka is not running")
        return 3
    try:
        ids = _broker_ids(node.bootstrap, 5.0)
        state = f"answering (brokers {sorted(ids)})"
    except KafkaException as exc:
        state = f"not answering: {exc}"
    print(f"local Kafka {KAFKA_VERSION} running (pid {pids[0]}), {state}")
    _print_location(node)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.kafka",
        description=f"Local Apache Kafka {KAFKA_VERSION} (KRaft) for txstage development.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="resolve the broker jars into the cache")
    for name, helptext in (
        ("up", "start one detached node on 127.0.0.1:9092 (idempotent)"),
        ("status", "say whether the local node runs and answers (exit 3 if not running)"),
    ):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--port", type=int, default=LOCAL_BROKER_PORT)
        cmd.add_argument("--controller-port", type=int, default=LOCAL_CONTROLLER_PORT)
        cmd.add_argument("--timeout", type=float, default=90.0)
    down = sub.add_parser("down", help="stop the local node (SIGTERM, then SIGKILL)")
    down.add_argument("--grace", type=float, default=30.0)
    args = parser.parse_args(argv)
    handlers = {"install": _cmd_install, "up": _cmd_up, "down": _cmd_down, "status": _cmd_status}
    try:
        return handlers[args.command](args)
    except KafkaHarnessError as exc:
        print(str(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
