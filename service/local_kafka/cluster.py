"""``KafkaCluster``: 1 or 3 nodes on free ports in a temp dir of their own, with faults.

Every node is started attached (see :mod:`service.local_kafka.node`): the cluster, its JVMs
and its temp dir go when it is closed, when the interpreter exits, or (temp dirs of a
SIGKILLed interpreter) at the next cluster start once they are 15 minutes old.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Literal

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from service.local_kafka.errors import KafkaStartError, LocalKafkaError
from service.local_kafka.jars import install
from service.local_kafka.node import Node, free_ports, tail_file, wait_for_start
from service.local_kafka.properties import HOST, broker_properties, kafka_uuid, write_properties
from service.local_kafka.readiness import listed_brokers, run_parallel, wait_ready
from service.local_kafka.security import ADMIN_USER, Secured, make_secured, upsert_scram_user

_WORKDIR_PREFIX = "txstage-kafka-"
_STALE_AFTER_SECONDS = 15 * 60

# Clusters started in this interpreter, closed at exit whatever happens.
_CLUSTERS: set[KafkaCluster] = set()
_CLUSTERS_LOCK = threading.Lock()


class ClusterRepairWarning(UserWarning):
    """The harness restarted a node that did not recover from a fault by itself."""


class KafkaCluster:
    """1 or 3 combined broker+controller nodes on 127.0.0.1, in a temp dir of their own.

    Node ids are ``0 .. nodes-1`` and are the ``i`` of :meth:`stop`, :meth:`kill`, … (the
    same ids Kafka reports as partition leaders). Use as a context manager::

        with KafkaCluster(nodes=3) as cluster:
            cluster.kill(leader)
            ...
            cluster.restart(leader)

    ``proxied=True``: each node's client listener (``PLAINTEXT``) is advertised at a port of
    its own that nothing listens on until a proxy does (``proxy_routes``: proxy port ->
    the node's real address), so every client that bootstraps at :attr:`bootstrap` talks
    through that proxy; a second listener (``DIRECT``, also the inter-broker one) is
    reached past it at :attr:`direct_bootstrap`, for verifiers and admin calls.

    ``secured=True``: each node also has a ``SASL_SSL`` listener (SCRAM-SHA-512, TLS with a
    CA made at start) at :attr:`secure_bootstrap`, and the StandardAuthorizer allows only
    what ACLs allow; :attr:`secured` has the CA and the super user's credentials (see
    :mod:`service.local_kafka.security`). :attr:`bootstrap` stays the harness's own
    plaintext listener. ``jit``: see :data:`service.local_kafka.node.JIT_OPTS`.
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        overrides: Mapping[str, str | int] | None = None,
        startup_timeout: float = 90.0,
        workdir: Path | None = None,
        proxied: bool = False,
        secured: bool = False,
        jit: Literal["quick", "full"] = "quick",
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = nodes
        self.proxied = proxied
        self.secure = secured
        self.jit: Literal["quick", "full"] = jit
        self.secured: Secured | None = None
        self.overrides = dict(overrides or {})
        self.startup_timeout = startup_timeout
        self._parent = workdir
        self.workdir = Path()
        self.libs = Path()
        self.nodes: list[Node] = []
        self.cluster_id = ""
        self.startup_seconds = 0.0

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> KafkaCluster:
        return self if self.nodes else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self, *, attempts: int = 3) -> KafkaCluster:
        """Install if needed, format and start every node, wait until the cluster is ready.

        A port taken between choosing it and the JVM binding it is retried on new ports.
        """
        if self.nodes:
            raise LocalKafkaError(f"{self!r} was started already")
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
        with _CLUSTERS_LOCK:
            _CLUSTERS.add(self)
        sweep_stale_workdirs(self._parent)
        self.workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX, dir=self._parent))
        per_node = 5
        ports = free_ports(per_node * self.size)
        controller_ports = {i: ports[per_node * i + 1] for i in range(self.size)}
        self.nodes = [
            Node(
                i,
                ports[per_node * i],
                ports[per_node * i + 1],
                self.workdir / f"node-{i}",
                advertised_port=ports[per_node * i + 2] if self.proxied else None,
                direct_port=ports[per_node * i + 3] if self.proxied else None,
                secure_port=ports[per_node * i + 4] if self.secure else None,
                jit=self.jit,
            )
            for i in range(self.size)
        ]
        if self.secure:
            self.secured = make_secured(self.workdir / "tls")
        self.cluster_id = kafka_uuid()
        for node in self.nodes:
            node.directory.mkdir(parents=True)
            write_properties(
                node.config,
                broker_properties(
                    node_id=node.node_id,
                    broker_port=node.broker_port,
                    controller_port=node.controller_port,
                    controller_ports=controller_ports,
                    log_dir=node.data,
                    overrides=self.overrides,
                    direct_port=node.direct_port,
                    advertised_port=node.advertised_port,
                    secure_port=node.secure_port,
                    secure=self.secured.broker_overrides() if self.secured else None,
                ),
            )
        quorum_args = self._quorum_args()
        run_parallel(
            [partial(node.format, self.libs, self.cluster_id, quorum_args) for node in self.nodes]
        )
        deadline = time.monotonic() + self.startup_timeout
        starts = {node.node_id: (node, node.start(self.libs)) for node in self.nodes}
        wait_for_start(starts, deadline)
        self._wait_ready(deadline)
        if self.secured is not None:
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            upsert_scram_user(admin, ADMIN_USER, self.secured.admin_password)

    def _quorum_args(self) -> list[str]:
        if self.size == 1:
            return ["--standalone"]
        voters = ",".join(
            f"{node.node_id}@{HOST}:{node.controller_port}:{kafka_uuid()}" for node in self.nodes
        )
        return ["--initial-controllers", voters]

    def _wait_ready(self, deadline: float) -> None:
        running = {node.node_id for node in self.nodes if node.alive() and not node.paused}
        try:
            wait_ready(
                self.direct_bootstrap,
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
        with _CLUSTERS_LOCK:
            _CLUSTERS.discard(self)

    def _kill_all(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(LocalKafkaError, subprocess.TimeoutExpired):
                node.kill()

    # -- addresses ---------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's broker address, comma-separated (stable across restarts)."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def direct_bootstrap(self) -> str:
        """Every node's address past any proxy (``bootstrap`` unless ``proxied``)."""
        return ",".join(node.direct_bootstrap for node in self.nodes)

    @property
    def secure_bootstrap(self) -> str:
        """``secured``: every node's SASL_SSL listener, comma-separated."""
        return ",".join(node.secure_bootstrap for node in self.nodes)

    @property
    def proxy_routes(self) -> dict[int, tuple[str, int]]:
        """``proxied``: the port each node advertises -> the node's real client listener,
        what a proxy must forward for clients at :attr:`bootstrap` to reach the cluster."""
        return {
            node.advertised_port: (HOST, node.broker_port)
            for node in self.nodes
            if node.advertised_port is not None
        }

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

    def _node(self, i: int) -> Node:
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
        wait_for_start({i: (node, node.start(self.libs))}, deadline)
        self._wait_ready(deadline)

    def heal(self, timeout: float | None = None, *, wedged_after: float = 30.0) -> None:
        """Resume paused nodes and restart dead ones, then wait until all serve again, so
        the next test gets a whole cluster. Does nothing to a whole, running cluster.

        Waiting means fresh clients are served, so that a test that goes on to wait for
        the stage tells a broker that did not recover apart from a stage that did not.
        A resumed node that the cluster still does not list (fenced) ``wedged_after``
        seconds after its SIGCONT is wedged (a node is unfenced within a second of its
        next heartbeat): it gets a JVM thread dump (SIGQUIT, into its log, for the
        post-mortem), then SIGKILL and a start on the same data dir, and a
        :class:`ClusterRepairWarning` says so: the test goes on against a serving
        cluster, and its report shows that the harness repaired the broker."""
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        resumed = [node for node in self.nodes if node.alive() and node.paused]
        for node in resumed:
            self.resume(node.node_id)
        for node in self.nodes:
            if not node.alive():
                self.restart(node.node_id, timeout)
        if resumed:
            self._wait_resumed(resumed, deadline, wedged_after)

    def _wait_resumed(self, resumed: list[Node], deadline: float, wedged_after: float) -> None:
        try:
            self._wait_ready(min(deadline, time.monotonic() + wedged_after))
            return
        except KafkaStartError:
            pass
        try:
            listed = listed_brokers(self.direct_bootstrap, 5.0)
        except KafkaException:  # no answer at all: every resumed node is wedged
            listed = set()
        for node in resumed:
            if node.node_id in listed or not node.alive():
                continue
            node.signal(signal.SIGQUIT)  # the JVM prints every thread's stack to its log
            time.sleep(1.0)
            warnings.warn(ClusterRepairWarning(
                f"node {node.node_id} was still fenced {wedged_after:.0f} s after SIGCONT; "
                f"restarted it (thread dump in {node.log}):\n{tail_file(node.log, 20)}"),
                stacklevel=3)
            node.kill()
            self.restart(node.node_id, max(1.0, deadline - time.monotonic()))
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


# Registered after node.py's hook (imported first), so it runs before it: clusters close
# their nodes in order, then whatever JVM is left is SIGKILLed.
@atexit.register
def _close_clusters() -> None:
    with _CLUSTERS_LOCK:
        clusters = list(_CLUSTERS)
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.close()
