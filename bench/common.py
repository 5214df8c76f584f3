"""Helpers shared by the benchmark and the demo: the environment of stage processes,
/proc readings, /metrics parsing, topics and offsets. Plain functions over a bootstrap
string; no test framework. The broker itself comes from the package
(:mod:`service.local_kafka`); a stage process is a :class:`bench.replica.Replica`.
Nothing here imports the test suite, which the wheel does not ship."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from service.kafka.reading import OffsetReader
from service.local_kafka.node import free_ports, port_open

REPO_ROOT = Path(__file__).resolve().parents[1]
# librdkafka log level of our helper clients: warnings and worse (not the info lines a
# client prints when it is destroyed while the broker goes away).
_QUIET = 4

# --------------------------------------------------------------------------- processes


def stage_env(settings: Mapping[str, str]) -> dict[str, str]:
    """The environment of a child: ours without any TXSTAGE_* (a stray variable in the
    caller's shell must not change what is measured), plus ``settings``."""
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("TXSTAGE_")}
    return {**base, **settings}


@dataclass(frozen=True, slots=True)
class ProcStatus:
    rss_kb: int
    threads: int


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int], proc: Path = Path("/proc")) -> float | None:
    """User + system CPU of ``pids`` and their reaped children (``/proc/<pid>/stat``
    utime, stime, cutime, cstime); None when one is gone or there is none."""
    total = 0
    pids = list(pids)
    for pid in pids:
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 on
        total += sum(int(v) for v in fields[11:15])
    return total / _CLOCK_TICKS if pids else None


def process_tree(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """``pid`` and its descendants, parents first (each thread's
    ``/proc/<pid>/task/<tid>/children``: a process started by any thread of its
    parent)."""
    tree, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        tree.append(current)
        with contextlib.suppress(OSError):
            for task in sorted((proc / str(current) / "task").iterdir()):
                with contextlib.suppress(OSError):
                    queue += [int(c) for c in (task / "children").read_text().split()]
    return tree


def tree_cpu_seconds(pids: Iterable[int], proc: Path = Path("/proc")) -> float | None:
    """``cpu_seconds`` of each of ``pids`` and all their descendants (a stage's worker
    processes, which the main process's own figure leaves out until it reaps them);
    None when one ended between the listing and the reading."""
    return cpu_seconds([p for pid in pids for p in process_tree(pid, proc)], proc)


# What a process's CPU is spent on, by thread: its main thread (the stage's and the
# bare loop's consume loop), librdkafka's own threads (named "rdk:main",
# "rdk:broker<id>"), and the rest (job pools, HTTP, threads that ended).
THREAD_GROUPS = ("loop", "librdkafka", "other")


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of ``pid``: its name and user + system CPU seconds
    (``/proc/<pid>/task``); empty when the process is gone."""
    threads: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                name = (task / "comm").read_text().strip()
                stat = (task / "stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                threads[int(task.name)] = (name, sum(int(v) for v in fields[11:13])
                                           / _CLOCK_TICKS)
    return threads


def cpu_by_thread_group(pid: int, before: Mapping[int, tuple[str, float]],
                        after: Mapping[int, tuple[str, float]],
                        total: float) -> dict[str, float]:
    """CPU seconds between two ``thread_cpu`` snapshots, by ``THREAD_GROUPS``;
    "other" is ``total`` (the whole process's, threads that ended included) less the
    rest."""
    return _split(before, after, total, THREAD_GROUPS, "other",
                  lambda tid, name: "loop" if tid == pid
                  else "librdkafka" if name.startswith("rdk:") else None)


def _split(before: Mapping[int, tuple[str, float]], after: Mapping[int, tuple[str, float]],
           total: float, groups: tuple[str, ...], rest: str,
           group_of: Callable[[int, str], str | None]) -> dict[str, float]:
    """CPU seconds between two ``thread_cpu`` snapshots by ``groups``: each thread's
    in the group ``group_of`` names (None: ``rest``), and ``rest`` is ``total`` less
    all the others (never below 0), whatever threads ended or began in between."""
    spent = dict.fromkeys(groups, 0.0)
    for tid, (name, seconds) in after.items():
        group = group_of(tid, name)
        if group is not None:
            spent[group] += seconds - before.get(tid, (name, 0.0))[1]
    spent[rest] = max(total - sum(v for g, v in spent.items() if g != rest), 0.0)
    return spent


# The broker JVM's CPU by thread (names as /proc shows them, cut to 15 characters):
# "jit" is HotSpot compiling the broker's code ("C1/C2 CompilerThread", the code cache
# sweeper), "gc" the collector and the VM's own thread, "requests" every other thread:
# Kafka's network and request-handler threads, the coordinators, the transaction
# marker sender. A broker compiles its code paths once, soon after it starts; in a
# benchmark of minutes it is still compiling exactly-once's in every run, so its JIT
# time is a cost of the benchmark's brevity, not of the records
# (docs/journal/2026-11-27-broker-cpu-by-thread.md).
BROKER_THREAD_GROUPS = ("requests", "jit", "gc")
_BROKER_JIT = ("C1 CompilerThre", "C2 CompilerThre", "Sweeper thread")
_BROKER_GC = ("GC Thread", "G1 ", "VM Thread", "VM Periodic")


def broker_cpu_by_thread_group(before: Mapping[int, tuple[str, float]],
                               after: Mapping[int, tuple[str, float]],
                               caused: float) -> dict[str, float]:
    """The broker's CPU seconds between two ``thread_cpu`` snapshots of its JVM, by
    ``BROKER_THREAD_GROUPS``; "requests" is ``caused`` (all its threads, less its idle
    rate) less the JIT and the collector (never below 0)."""
    return _split(before, after, caused, BROKER_THREAD_GROUPS, "requests",
                  lambda tid, name: "jit" if name.startswith(_BROKER_JIT)
                  else "gc" if name.startswith(_BROKER_GC) else None)


def listening_pids(bootstrap: str) -> tuple[int, ...]:
    """The local processes listening on ``bootstrap``'s ports (a broker on this box:
    its JVM), found through ``/proc/net/tcp*`` and each process's socket descriptors;
    () for a broker elsewhere."""
    ports = {int(address.rpartition(":")[2]) for address in bootstrap.split(",")}
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) in ports:
                    inodes.add(f"socket:[{fields[9]}]")
    pids = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                pids.add(int(fd_dir.parent.name))
    return tuple(sorted(pids))


def proc_status(pid: int) -> ProcStatus:
    """VmRSS and Threads from /proc/<pid>/status."""
    fields: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return ProcStatus(int(fields["VmRSS"].split()[0]), int(fields["Threads"]))


# ----------------------------------------------------------------------------- metrics


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram as scraped: cumulative ``(le, count)`` buckets, sum, count."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Like PromQL ``histogram_quantile``: linear within the bucket holding rank q*count,
        so the answer is only as fine as the buckets (exact at bucket bounds)."""
        if not self.count:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if le == float("inf"):
                    return lower  # past the last finite bound: all PromQL can say
                span = cumulative - below
                return lower + (le - lower) * ((rank - below) / span if span else 1.0)
            lower, below = le, cumulative
        return lower

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since ``earlier`` (same buckets)."""
        old = dict(earlier.buckets)
        return Histogram(tuple((le, c - old.get(le, 0.0)) for le, c in self.buckets),
                         self.total - earlier.total, self.count - earlier.count)


EMPTY_HISTOGRAM = Histogram((), 0.0, 0.0)


def histogram(text: str, name: str, **labels: str) -> Histogram:
    """The histogram ``name`` in a /metrics page (empty if absent); with ``labels``, the
    series with those label values."""
    for family in text_string_to_metric_families(text):
        if family.name != name or family.type != "histogram":
            continue
        buckets: list[tuple[float, float]] = []
        total = count = 0.0
        for sample in family.samples:
            if any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            if sample.name == f"{name}_bucket":
                buckets.append((float(sample.labels["le"]), float(sample.value)))
            elif sample.name == f"{name}_sum":
                total = float(sample.value)
            elif sample.name == f"{name}_count":
                count = float(sample.value)
        return Histogram(tuple(sorted(buckets)), total, count)
    return EMPTY_HISTOGRAM


def metric_value(text: str, name: str) -> float | None:
    """The sum over all label sets of gauge/counter ``name`` (counters: pass the family
    name, without ``_total``); None if absent."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            values = [s.value for s in family.samples
                      if s.name in (name, f"{name}_total")]
            return float(sum(values)) if values else None
    return None


# ------------------------------------------------------------------------ topics, offsets

TopicPartitionKey = tuple[str, int]


def ensure_topics(bootstrap: str, topics: Mapping[str, int], timeout: float = 30.0) -> list[str]:
    """Create each ``name: partitions`` that does not exist yet; return those created.
    Waits until every partition of every topic has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": _QUIET})
    existing = admin.list_topics(timeout=timeout).topics
    new = [NewTopic(name, num_partitions=n, replication_factor=-1)
           for name, n in topics.items() if name not in existing]
    created = []
    if new:
        for name, future in admin.create_topics(new, request_timeout=timeout).items():
            try:
                future.result(timeout + 5)
                created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    _wait_for_leaders(admin, list(topics), timeout)
    return created


def _wait_for_leaders(admin: AdminClient, topics: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(timeout=timeout).topics
        if all(name in metadata and metadata[name].partitions
               and all(p.leader >= 0 for p in metadata[name].partitions.values())
               for name in topics):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {topics} have no leader for every partition")
        time.sleep(0.1)


def partitions_of(bootstrap: str, topic: str, timeout: float = 15.0) -> list[TopicPartitionKey]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": _QUIET})
    metadata = admin.list_topics(topic, timeout=timeout)
    return [(topic, p) for p in sorted(metadata.topics[topic].partitions)]


def offset_probe(bootstrap: str, group_id: str | None = None) -> OffsetReader:
    """Cheap repeated offset queries through long-lived clients (service.kafka.reading's
    OffsetReader): ``end_offsets`` are high watermarks; ``committed`` offsets are read
    without RequireStable, so the probe never waits for a transaction in flight."""
    return OffsetReader({"bootstrap.servers": bootstrap, "log_level": _QUIET}, group_id,
                        stable=False)


def behind(ends: Mapping[TopicPartitionKey, int],
           committed: Mapping[TopicPartitionKey, int]) -> int:
    """Records between the committed offsets and the end offsets, summed."""
    return sum(max(end - max(committed.get(key, 0), 0), 0) for key, end in ends.items())


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    return free_ports(1)[0]


def port_taken(port: int) -> bool:
    """Something listens on 127.0.0.1:``port``."""
    return port_open(port)


# ------------------------------------------------------------------------ broker's log


@dataclass(frozen=True)
class LogBatches:
    """What a topic's log holds, batch by batch: the broker's units of work (each
    batch is one append, one CRC check, one idempotence check; each control batch is
    one transaction marker written to one partition)."""

    batches: int
    records: int
    control_batches: int

    def per_100k(self, inputs: int) -> dict[str, float]:
        scale = 100_000 / inputs if inputs else 0.0
        data = self.batches - self.control_batches
        return {"data_batches": round(data * scale, 1),
                "markers": round(self.control_batches * scale, 1),
                "records_per_data_batch": round((self.records - self.control_batches)
                                                / data, 1) if data else 0.0}


def log_batches(data_dir: Path, topic: str, libs: Path) -> LogBatches:
    """Count the record batches in every segment of ``topic`` under a broker's log
    directory, with Kafka's own DumpLogSegments (no record is decoded)."""
    segments = sorted(str(f) for f in data_dir.glob(f"{topic}-*/*.log"))
    if not segments:
        return LogBatches(0, 0, 0)
    java = shutil.which("java") or "java"
    dumped = subprocess.run(
        [java, "-cp", f"{libs}/*", "kafka.tools.DumpLogSegments", "--files", ",".join(segments)],
        capture_output=True, text=True, check=True, timeout=300).stdout
    batches = records = control = 0
    for line in dumped.splitlines():
        if not line.startswith("baseOffset:"):
            continue
        fields = line.split()
        values = dict(zip(fields[::2], fields[1::2], strict=False))
        batches += 1
        records += int(values.get("count:", "0"))
        control += values.get("isControl:") == "true"
    return LogBatches(batches, records, control)
