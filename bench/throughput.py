"""Throughput of the stage as ratios measured in one run (docs/benchmarks.md).

One broker, one pre-filled input topic, then one process at a time over it, each with
its own consumer group and output topic:

- ``exactly_once``: a replica (``python -m service run``), 100 ms commit interval
- ``at_least_once``: the same replica in at-least-once mode
- ``bare``: ``python -m bench.bare``, a consume → produce loop without transactions

An unmeasured exactly-once replica warms the broker up first. Each mode is timed from
its first output reaching the broker to its group's committed offsets reaching the
input's end offsets, then checked with ``service.tools.verify``. ``--repeat N`` interleaves N
rounds and reports median ratios; ``--scaling`` adds exactly-once runs over 4 and 64
input partitions; ``--profile FILE`` instead runs one exactly-once replica under
cProfile (or pyinstrument) and summarises where its loop thread spends its time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import confluent_kafka
from confluent_kafka import Producer

from bench import broker_profile
from bench.bare import ASSIGNED_LINE
from bench.broker_profile import BrokerProfile
from bench.common import (
    BROKER_THREAD_GROUPS,
    REPO_ROOT,
    THREAD_GROUPS,
    ProcStatus,
    TopicPartitionKey,
    behind,
    broker_cpu_by_thread_group,
    cpu_by_thread_group,
    cpu_seconds,
    ensure_topics,
    free_port,
    histogram,
    listening_pids,
    log_batches,
    metric_value,
    offset_probe,
    partitions_of,
    proc_status,
    stage_env,
    thread_cpu,
)
from bench.replica import Replica
from bench.transforms import identity
from service.contract.records import Transform
from service.kafka.reading import HangingTransactionError
from service.tools.verify import verify

MODES = ("exactly_once", "at_least_once", "bare")
VARIANT = "exactly_once_variant"  # --variant: exactly-once with other settings
TRANSFORM = "bench.transforms:identity"
COMMIT_INTERVAL_MS = 100
BATCH_SIZE = 500  # the stage's default TXSTAGE_BATCH_SIZE, passed to every mode
POLL_S = 0.1      # committed-offset polling period
STEADY = (0.1, 0.9)  # the steady rate: between these fractions of the records committed
FIRST_OUTPUT_POLL_S = 0.02
SCALING_PARTITIONS = (4, 64)
# bootstrap -> (log directory, Kafka's libs) of a broker started here (see broker())
PRIVATE_LOGS: dict[str, tuple[Path, Path]] = {}


@dataclass(frozen=True)
class Workload:
    """A pre-filled input topic and where to put logs."""

    bootstrap: str
    topic: str
    partitions: int
    records: int
    value_bytes: int
    run_id: str
    log_dir: Path
    ends: dict[TopicPartitionKey, int]
    prefill_s: float
    commit_interval_ms: int = COMMIT_INTERVAL_MS
    variant: tuple[tuple[str, str], ...] = ()  # the VARIANT mode's extra TXSTAGE_* settings
    broker_pids: tuple[int, ...] = ()  # the broker's JVM when it runs on this box
    broker_idle_cpu_per_s: float = 0.0  # its CPU rate with no client working
    output_partitions: int | None = None  # the output topic's (None: as many as the input)

    @property
    def outputs(self) -> int:
        return self.output_partitions or self.partitions

    @property
    def timeout_s(self) -> float:
        return max(180.0, self.records / 500)


@dataclass
class ModeResult:
    """One measured process over one workload."""

    mode: str
    partitions: int
    records: int
    seconds: float
    records_per_s: float
    mb_per_s: float
    startup_s: float
    exit_code: int
    log: str
    commit_p50_ms: float | None = None
    commit_p99_ms: float | None = None
    commit_mean_ms: float | None = None
    transactions: int = 0
    records_per_txn_mean: float | None = None
    producer_init_mean_ms: float | None = None
    producer_init_p99_ms: float | None = None
    rebalance_ms: float | None = None
    pinned_producers: int | None = None
    memory: dict[str, ProcStatus | None] = field(default_factory=dict)
    verified: bool | None = None
    problems: list[str] = field(default_factory=list)
    duplicates: int = 0
    outputs_found: int = 0
    steady_records_per_s: float | None = None  # between 10 and 90 % committed (steady_rate)
    loadavg_1m: float = 0.0  # at the start: other work on the box skews absolute figures
    # CPU-seconds per 100,000 records over the measured window: the process's own (all
    # its threads), and the broker's above its idle rate (None: not on this box)
    cpu_s_per_100k: float | None = None
    broker_cpu_s_per_100k: float | None = None
    # the process's, by bench.common.THREAD_GROUPS (loop, librdkafka, other)
    cpu_by_thread_per_100k: dict[str, float] = field(default_factory=dict)
    # the broker's, by bench.common.BROKER_THREAD_GROUPS (requests, jit, gc)
    broker_cpu_by_thread_per_100k: dict[str, float] = field(default_factory=dict)
    # --broker-profile: the broker's JFR samples per 100k records by what it was doing
    broker_samples_per_100k: dict[str, float] | None = None
    output_topic: str = ""
    # The output topic's log per 100k inputs (--scaling, private broker only)
    output_log: dict[str, float] | None = None


# ---------------------------------------------------------------------------- workload


def prefill(bootstrap: str, topic: str, partitions: int, records: int,
            value_bytes: int) -> float:
    """Write ``records`` values of ``value_bytes`` round-robin; key ``k<i>``. Seconds taken."""
    started = time.monotonic()
    ensure_topics(bootstrap, {topic: partitions})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20})
    filler = b"." * value_bytes
    for i in range(records):
        value = (b"%d:" % i + filler)[:value_bytes]
        while True:
            try:
                producer.produce(topic, value, b"k%d" % i, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise RuntimeError(f"prefill of {topic} not delivered")
    return time.monotonic() - started


def workload(bootstrap: str, run_id: str, log_dir: Path, args: argparse.Namespace,
             partitions: int) -> Workload:
    """A new input topic of ``partitions``, pre-filled as ``args`` say."""
    topic = f"bench-{run_id}-in-{partitions}"
    seconds = prefill(bootstrap, topic, partitions, args.records, args.value_bytes)
    with offset_probe(bootstrap) as probe:
        ends = probe.end_offsets(partitions_of(bootstrap, topic))
    if sum(ends.values()) != args.records:
        raise RuntimeError(f"{topic} holds {sum(ends.values())} records, not {args.records}")
    return Workload(bootstrap, topic, partitions, args.records, args.value_bytes, run_id,
                    log_dir, ends, seconds, args.commit_interval_ms,
                    broker_pids=listening_pids(bootstrap))


def _setting(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name.startswith("TXSTAGE_"):
        raise SystemExit(f"--variant takes TXSTAGE_NAME=VALUE, not {item!r}")
    return name, value


def with_broker_idle_rate(w: Workload, seconds: float = 3.0) -> Workload:
    """``w`` with its broker's CPU rate while no client works (subtracted from each
    mode's broker CPU: what the mode *caused*)."""
    before = cpu_seconds(w.broker_pids)
    time.sleep(seconds)
    after = cpu_seconds(w.broker_pids)
    if before is None or after is None:
        return w
    return replace(w, broker_idle_cpu_per_s=(after - before) / seconds)


# ------------------------------------------------------------------------------ a mode


def _process(w: Workload, mode: str, group: str, output: str,
             argv: Sequence[str] | None, log_suffix: str = "") -> Replica:
    settings = {
        "TXSTAGE_BOOTSTRAP_SERVERS": w.bootstrap, "TXSTAGE_GROUP_ID": group,
        "TXSTAGE_INPUT_TOPICS": w.topic, "TXSTAGE_OUTPUT_TOPIC": output,
        "TXSTAGE_TRANSFORM": TRANSFORM, "TXSTAGE_COMMIT_INTERVAL_MS": str(w.commit_interval_ms),
        "TXSTAGE_BATCH_SIZE": str(BATCH_SIZE), "TXSTAGE_LOG_FORMAT": "json",
        "TXSTAGE_METRICS_HOST": "127.0.0.1",
        "TXSTAGE_GUARANTEE": "at_least_once" if mode == "at_least_once" else "exactly_once",
    }
    if mode == VARIANT:
        settings.update(w.variant)
    port = free_port()
    settings["TXSTAGE_METRICS_PORT"] = str(port)
    if argv is None:
        argv = ("-m", "bench.bare") if mode == "bare" else ("-m", "service", "run")
    return Replica(mode, stage_env(settings), w.log_dir / f"{group}{log_suffix}.log",
                   port, argv)


def _poll(condition: Callable[[], bool], proc: Replica, timeout: float, period: float,
          what: str) -> float:
    """Poll until ``condition``; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return time.monotonic()
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.returncode()}) while waiting for "
                               f"{what}\n{proc.log_excerpt()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name}: no {what} after {timeout:.0f} s\n"
                               f"{proc.log_excerpt()}")
        time.sleep(period)


def _sample_before_assignment(proc: Replica, timeout: float) -> ProcStatus | None:
    """/proc status as soon as the replica serves HTTP, while it has no partitions yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.alive():
        answer = proc.answer("/readyz", 0.5)
        if answer is not None:
            status = proc_status(proc.pid)
            detail = json.loads(answer[1])
            return status if detail.get("assigned") is None else None
        time.sleep(0.01)
    return None


def _ready(proc: Replica) -> Callable[[], bool]:
    if proc.argv[-1] == "bench.bare":
        return lambda: ASSIGNED_LINE in proc.log_path.read_text(errors="replace")
    return proc.ready


def measure(w: Workload, mode: str, *, argv: Sequence[str] | None = None,
            tag: str = "", profile: BrokerProfile | None = None) -> ModeResult:
    """Run one process over the workload until everything is committed, then verify;
    with ``profile``, the broker is recorded from the process's start to that commit."""
    group = f"bench-{w.run_id}-{mode}{tag}-{w.partitions}"
    output = f"{group}-out"
    ensure_topics(w.bootstrap, {output: w.outputs})
    out_keys = [(output, p) for p in range(w.outputs)]
    proc = _process(w, mode, group, output, argv)
    memory: dict[str, ProcStatus | None] = {}
    load = os.getloadavg()[0]
    with offset_probe(w.bootstrap, group) as probe:
        if profile is not None:
            profile.start(f"{mode}{tag}")
        launched = time.monotonic()
        proc.start()
        try:
            if mode != "bare":
                memory["before_assignment"] = _sample_before_assignment(proc, 60)
            ready_at = _poll(_ready(proc), proc, 120, 0.02, "readiness")
            memory["at_ready"] = proc_status(proc.pid)
            first = _poll(lambda: sum(probe.end_offsets(out_keys).values()) > 0, proc,
                          w.timeout_s, FIRST_OUTPUT_POLL_S, "first output")
            cpu_first = cpu_seconds([proc.pid]), cpu_seconds(w.broker_pids)
            threads_first, broker_first = thread_cpu(proc.pid), _broker_threads(w)
            progress: list[tuple[float, int]] = []  # (when, records committed)

            def all_committed() -> bool:
                left = behind(w.ends, probe.committed(w.ends))
                progress.append((time.monotonic(), w.records - left))
                return left == 0
            done = _poll(all_committed, proc, w.timeout_s, POLL_S, "all inputs committed")
            cpu_done = cpu_seconds([proc.pid]), cpu_seconds(w.broker_pids)
            threads_done, broker_done = thread_cpu(proc.pid), _broker_threads(w)
            recording = profile.stop() if profile is not None else None
            memory["at_end"] = proc_status(proc.pid)
            text = proc.scrape()
        finally:
            code = proc.stop()
    seconds = done - first
    result = ModeResult(mode=mode, partitions=w.partitions, records=w.records,
                        seconds=round(seconds, 3),
                        records_per_s=round(w.records / seconds, 1),
                        mb_per_s=round(w.records * w.value_bytes / seconds / 1e6, 2),
                        startup_s=round(ready_at - launched, 3), exit_code=code,
                        log=str(proc.log_path), memory=memory, loadavg_1m=round(load, 2),
                        output_topic=output)
    result.steady_records_per_s = steady_rate(progress, w.records)
    _cpu(result, w, cpu_first, cpu_done)
    own0, own1 = cpu_first[0], cpu_done[0]
    if own0 is not None and own1 is not None and threads_done:
        result.cpu_by_thread_per_100k = {
            group: round(seconds * 100_000 / w.records, 3) for group, seconds in
            cpu_by_thread_group(proc.pid, threads_first, threads_done, own1 - own0).items()}
    if result.broker_cpu_s_per_100k is not None and broker_done:
        result.broker_cpu_by_thread_per_100k = {
            group: round(seconds * 100_000 / w.records, 3) for group, seconds in
            broker_cpu_by_thread_group(broker_first, broker_done,
                                       result.broker_cpu_s_per_100k * w.records / 100_000
                                       ).items()}
    if profile is not None and recording is not None:
        counts = broker_profile.summarise(profile.samples(recording))
        result.broker_samples_per_100k = {
            cat: round(n * 100_000 / w.records, 1) for cat, n in counts.most_common()}
    _read_metrics(result, text)
    _verify(result, w, group, output)
    return result


def _broker_threads(w: Workload) -> dict[int, tuple[str, float]]:
    return thread_cpu(w.broker_pids[0]) if len(w.broker_pids) == 1 else {}


def steady_rate(progress: Sequence[tuple[float, int]], records: int) -> float | None:
    """Records per second between the moments 10 % and 90 % of ``records`` were
    committed, each interpolated between the two polls around it: the rate without the
    start or the drain. The end-to-end rate (first output to all committed) also holds
    the last commit's latency, which a bare loop that commits without waiting for its
    outputs hardly has, and exactly-once has most (a transaction's commit)."""
    def crossing(fraction: float) -> float | None:
        target, before = fraction * records, None
        for when, done in progress:
            if done >= target:
                if before is None or done == before[1]:
                    return when
                return before[0] + (when - before[0]) * (target - before[1]) / (done - before[1])
            before = (when, done)
        return None
    start, end = crossing(STEADY[0]), crossing(STEADY[1])
    if start is None or end is None or end <= start:
        return None
    return round((STEADY[1] - STEADY[0]) * records / (end - start), 1)


def _cpu(result: ModeResult, w: Workload, first: tuple[float | None, float | None],
         done: tuple[float | None, float | None]) -> None:
    per_100k = 100_000 / w.records
    (own0, broker0), (own1, broker1) = first, done
    if own0 is not None and own1 is not None:
        result.cpu_s_per_100k = round((own1 - own0) * per_100k, 3)
    if broker0 is not None and broker1 is not None:
        caused = broker1 - broker0 - w.broker_idle_cpu_per_s * result.seconds
        result.broker_cpu_s_per_100k = round(caused * per_100k, 3)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _read_metrics(result: ModeResult, text: str) -> None:
    if not text:
        return
    commit = histogram(text, "txstage_transaction_commit_seconds")
    result.commit_p50_ms = _ms(commit.quantile(0.5))
    result.commit_p99_ms = _ms(commit.quantile(0.99))
    result.commit_mean_ms = _ms(commit.mean)
    result.transactions = int(commit.count)
    per_txn = histogram(text, "txstage_records_per_transaction").mean
    result.records_per_txn_mean = None if per_txn is None else round(per_txn, 1)
    init = histogram(text, "txstage_producer_init_seconds")
    result.producer_init_mean_ms = _ms(init.mean)
    result.producer_init_p99_ms = _ms(init.quantile(0.99))
    result.rebalance_ms = _ms(histogram(text, "txstage_rebalance_seconds").mean)
    pinned = metric_value(text, "txstage_pinned_producers")
    result.pinned_producers = None if pinned is None else int(pinned)


def _verify(result: ModeResult, w: Workload, group: str, output: str,
            transform: Transform = identity) -> None:
    """Lineage check (V1-V5) of what was measured; must be clean for exactly-once."""
    try:
        report = verify(w.bootstrap, input_topics=[w.topic], output_topics=[output],
                        group_id=group, transform=transform, default_topic=output,
                        timeout_s=120)
    except HangingTransactionError as exc:
        result.verified, result.problems = False, [f"V5 hanging transaction: {exc}"]
        return
    result.verified = report.ok
    result.problems = report.problems()
    result.duplicates = len(report.duplicates)
    result.outputs_found = report.found


# ------------------------------------------------------------------------------ report


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def _known_ratio(a: float | None, b: float | None) -> float:
    return ratio(a, b) if a is not None and b else float("nan")


def ratios(results: dict[str, ModeResult]) -> dict[str, float]:
    eos, alo, bare = (results[m] for m in MODES)
    found = {"eos_over_alo": ratio(eos.records_per_s, alo.records_per_s),
             "eos_over_bare": ratio(eos.records_per_s, bare.records_per_s),
             "alo_over_bare": ratio(alo.records_per_s, bare.records_per_s),
             "eos_over_bare_steady": _known_ratio(eos.steady_records_per_s,
                                                bare.steady_records_per_s),
             "alo_over_bare_steady": _known_ratio(alo.steady_records_per_s,
                                                bare.steady_records_per_s),
             "broker_cpu_eos_over_alo": _known_ratio(eos.broker_cpu_s_per_100k,
                                                   alo.broker_cpu_s_per_100k),
             "broker_requests_cpu_eos_over_alo": _known_ratio(
                 eos.broker_cpu_by_thread_per_100k.get("requests"),
                 alo.broker_cpu_by_thread_per_100k.get("requests"))}
    if VARIANT in results:
        variant = results[VARIANT]
        found |= {"variant_over_eos": ratio(variant.records_per_s, eos.records_per_s),
                  "variant_cpu_over_eos": _known_ratio(variant.cpu_s_per_100k,
                                                     eos.cpu_s_per_100k),
                  "broker_cpu_variant_over_alo": _known_ratio(variant.broker_cpu_s_per_100k,
                                                            alo.broker_cpu_s_per_100k)}
    return found


def median_ratios(runs: dict[str, list[ModeResult]]) -> dict[str, float]:
    """Each ratio within each round of the interleaved runs, then the median over rounds."""
    rounds = [ratios({mode: results[i] for mode, results in runs.items()})
              for i in range(len(runs[MODES[0]]))]
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _verdict(r: ModeResult) -> str:
    if r.verified:
        return "clean"
    return f"{len(r.problems)} problem(s), {r.duplicates} duplicates"


def _table(results: Sequence[ModeResult]) -> list[str]:
    lines = [f"{'mode':<15}{'parts':>6}{'rec/s':>10}{'MB/s':>8}{'time s':>8}"
             f"{'commit p50/p99/mean ms':>25}{'rec/txn':>9}{'txns':>7}  verify"]
    for r in results:
        commit = (f"{_fmt(r.commit_p50_ms)}/{_fmt(r.commit_p99_ms)}/{_fmt(r.commit_mean_ms)}"
                  if r.transactions else "-")
        lines.append(f"{r.mode:<15}{r.partitions:>6}{r.records_per_s:>10,.0f}{r.mb_per_s:>8.1f}"
                     f"{r.seconds:>8.2f}{commit:>25}{_fmt(r.records_per_txn_mean):>9}"
                     f"{r.transactions:>7}  {_verdict(r)}")
    return lines


def _startup_lines(results: Sequence[ModeResult]) -> list[str]:
    lines = []
    for r in results:
        if r.mode == "bare":
            continue
        lines.append(f"  {r.mode:<14} {r.partitions:>3} partitions: process start -> ready "
                     f"{r.startup_s:.2f} s, assignment -> producers ready "
                     f"{_fmt(r.rebalance_ms, ' ms')}, producer init mean "
                     f"{_fmt(r.producer_init_mean_ms, ' ms')} (p99 <= "
                     f"{_fmt(r.producer_init_p99_ms, ' ms')})")
    return lines


def _cpu_lines(results: Sequence[ModeResult]) -> list[str]:
    return [f"  {r.mode:<14} {r.partitions:>3} partitions: process "
            f"{_fmt(r.cpu_s_per_100k, ' s', 2)}{_by_thread(r)}, broker "
            f"{_fmt(r.broker_cpu_s_per_100k, ' s', 2)}{_by_broker_thread(r)}"
            for r in results]


def _by_broker_thread(r: ModeResult) -> str:
    spent = r.broker_cpu_by_thread_per_100k
    if not spent:
        return ""
    return " (" + ", ".join(f"{group} {spent[group]:.2f}"
                            for group in BROKER_THREAD_GROUPS) + ")"


def _by_thread(r: ModeResult) -> str:
    spent = r.cpu_by_thread_per_100k
    if not spent:
        return ""
    return " (" + ", ".join(f"{group} {spent[group]:.2f}" for group in THREAD_GROUPS) + ")"


def _memory(status: ProcStatus | None) -> str:
    return "-" if status is None else f"{status.rss_kb / 1024:.0f} MB/{status.threads} thr"


def _memory_lines(results: Sequence[ModeResult]) -> list[str]:
    lines = []
    for r in results:
        m = r.memory
        lines.append(f"  {r.mode:<14} {r.partitions:>3} partitions: before assignment "
                     f"{_memory(m.get('before_assignment'))}, at ready "
                     f"{_memory(m.get('at_ready'))}, at end {_memory(m.get('at_end'))}")
    return lines


def scaling_summary(small: ModeResult, large: ModeResult) -> dict[str, float | None]:
    """64 ÷ 4 throughput, and the marginal cost of one more pinned producer."""
    extra = large.partitions - small.partitions
    summary: dict[str, float | None] = {
        "ratio": ratio(large.records_per_s, small.records_per_s)}
    # At ready, before much data is buffered; RSS at the end mostly measures buffered
    # records (bigger transactions with fewer partitions), not producers.
    a, b = small.memory.get("at_ready"), large.memory.get("at_ready")
    if a is not None and b is not None:
        summary["rss_kb_per_producer_at_ready"] = round((b.rss_kb - a.rss_kb) / extra, 1)
        summary["threads_per_producer_at_ready"] = round((b.threads - a.threads) / extra, 2)
    before, ready = large.memory.get("before_assignment"), large.memory.get("at_ready")
    if before is not None and ready is not None:
        summary["rss_kb_per_producer_in_run"] = round(
            (ready.rss_kb - before.rss_kb) / large.partitions, 1)
        summary["threads_per_producer_in_run"] = round(
            (ready.threads - before.threads) / large.partitions, 2)
    return summary


def machine() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(),
            "confluent_kafka": str(confluent_kafka.version()),
            "librdkafka": confluent_kafka.libversion()[0],
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "code": code_version()}


def code_version() -> str:
    """The commit measured, and whether tracked files of service/ had uncommitted changes."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,
                                  text=True, check=False, timeout=10).stdout.strip()
        except OSError:
            return ""
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "service")
    return f"{head}+dirty(service/)" if dirty else head


# -------------------------------------------------------------------------------- main


@contextlib.contextmanager
def broker(bootstrap: str | None, say: Callable[[str], None]) -> Iterator[str]:
    """The given broker, or a private single node started here and closed at the end."""
    if bootstrap:
        yield bootstrap
        return
    from service.local_kafka.cluster import KafkaCluster
    from service.local_kafka.jars import KAFKA_VERSION

    with KafkaCluster(nodes=1, jit="full") as cluster:  # C2 too, as a real broker runs
        say(f"private Kafka {KAFKA_VERSION} node at {cluster.bootstrap} "
            f"(started in {cluster.startup_seconds:.1f} s)")
        PRIVATE_LOGS[cluster.bootstrap] = (cluster.nodes[0].data, cluster.libs)
        try:
            yield cluster.bootstrap
        finally:
            PRIVATE_LOGS.pop(cluster.bootstrap, None)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--bootstrap", default=None,
                        help="an existing broker (default: start a private single node)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--scaling", action="store_true",
                        help="also run exactly-once over 4 and 64 input partitions")
    parser.add_argument("--scaling-outputs", type=int, default=None, metavar="N",
                        help="with --scaling: output topics of N partitions (default: as "
                             "many as the input's, 4 and 64)")
    parser.add_argument("--profile", metavar="FILE", type=Path, default=None,
                        help="only profile one exactly-once replica into FILE (pstats format)")
    parser.add_argument("--profile-mode", choices=(*MODES[:2], VARIANT), default="exactly_once",
                        help="with --profile: which guarantee to profile (exactly_once_variant:"
                             " exactly-once with the --variant settings)")
    parser.add_argument("--profiler", choices=sorted(PROFILERS), default="cprofile",
                        help="with --profile (pyinstrument must be installed in the venv)")
    parser.add_argument("--commit-interval-ms", type=int, default=COMMIT_INTERVAL_MS,
                        help="TXSTAGE_COMMIT_INTERVAL_MS of every mode (design: 100)")
    parser.add_argument("--warm-up", type=int, default=50_000, metavar="RECORDS",
                        help="records an unmeasured replica processes first (0: none)")
    parser.add_argument("--variant", action="append", default=[], metavar="TXSTAGE_X=V",
                        help="also run exactly-once with these settings (repeatable) in "
                             "every round, as the mode exactly_once_variant")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the modes this many times, interleaved; report the medians")
    parser.add_argument("--broker-profile", metavar="DIR", type=Path, default=None,
                        help="record the broker JVM with Java Flight Recorder during each "
                             "measured run into DIR/<mode>.jfr and summarise where its "
                             "time went (bench/broker_profile.py)")
    parser.add_argument("--top", type=int, default=25, help="functions listed with --profile")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(parse_args(argv))
    except KeyboardInterrupt:  # processes are stopped and the broker removed on the way out
        print("interrupted", file=sys.stderr)
        return 130


def start_run(name: str, *, json_output: bool) -> tuple[Callable[[str], None], str,
                                                       Path, dict[str, object]]:
    """Progress printer (stderr when stdout carries JSON), run id, log dir, machine facts."""
    def say(line: str) -> None:
        print(line, file=sys.stderr if json_output else sys.stdout, flush=True)

    run_id = uuid.uuid4().hex[:6]
    log_dir = Path(tempfile.mkdtemp(prefix=f"{name}-{run_id}-"))
    return say, run_id, log_dir, machine()


def run(args: argparse.Namespace) -> int:
    say, run_id, log_dir, info = start_run("txstage-bench", json_output=args.json)
    say(f"txstage bench {run_id}: {args.records:,} records x {args.value_bytes} B, "
        f"{args.partitions} partitions, commit interval {args.commit_interval_ms} ms, "
        f"{info['cpus']} CPUs, load {info['loadavg_at_start']}; logs in {log_dir}")
    with broker(args.bootstrap, say) as bootstrap:
        w = replace(workload(bootstrap, run_id, log_dir, args, args.partitions),
                    variant=tuple(_setting(item) for item in args.variant))
        say(f"input {w.topic}: prefilled in {w.prefill_s:.1f} s")
        if args.profile is not None:
            warm_up(w, args.warm_up, say)
            return run_profile(w, args.profile.resolve(), args.profiler, args.top, say,
                               args.profile_mode)
        warm_up(w, args.warm_up, say)
        w = with_broker_idle_rate(w)
        runs = run_modes(w, args.repeat, say, _broker_profile(args, w))
        scaling = (run_scaling(bootstrap, run_id, log_dir, args, say,
                               w.broker_idle_cpu_per_s) if args.scaling else [])
    return report(args, info, w, runs, scaling)


def _broker_profile(args: argparse.Namespace, w: Workload) -> BrokerProfile | None:
    if args.broker_profile is None:
        return None
    if len(w.broker_pids) != 1:
        raise SystemExit("--broker-profile needs a broker JVM on this box (one process "
                         f"listening on {w.bootstrap}; found {len(w.broker_pids)})")
    return BrokerProfile(w.broker_pids[0], args.broker_profile.resolve())


def run_modes(w: Workload, repeat: int, say: Callable[[str], None],
              profile: BrokerProfile | None = None) -> dict[str, list[ModeResult]]:
    """Every mode ``repeat`` times, interleaved (EOS, ALO, bare, EOS, ...), so a burst of
    other load on the box or a warming broker does not favour one mode."""
    modes = (*MODES, VARIANT) if w.variant else MODES
    runs: dict[str, list[ModeResult]] = {mode: [] for mode in modes}
    for i in range(repeat):
        for mode in modes:
            r = measure(w, mode, tag=f"-r{i}" if repeat > 1 else "", profile=profile)
            runs[mode].append(r)
            say(f"  {mode}: {r.records_per_s:,.0f} rec/s in {r.seconds:.2f} s "
                f"(load {r.loadavg_1m:.1f}), {_verdict(r)}")
    return runs


def warm_up(w: Workload, records: int, say: Callable[[str], None]) -> None:
    """An unmeasured exactly-once replica over the first ``records`` of the input: the
    broker's JIT, page cache and transaction coordinator are warm before the first mode."""
    if records <= 0:
        return
    group = f"bench-{w.run_id}-warmup-{w.partitions}"
    ensure_topics(w.bootstrap, {f"{group}-out": w.partitions})
    proc = _process(w, "exactly_once", group, f"{group}-out", None)
    target = min(records, w.records)
    started = time.monotonic()
    with offset_probe(w.bootstrap, group) as probe:
        proc.start()
        try:
            _poll(lambda: sum(max(o, 0) for o in probe.committed(w.ends).values()) >= target,
                  proc, w.timeout_s, POLL_S, "warm-up")
        finally:
            proc.stop()
    say(f"  warm-up: {target:,} records through an exactly-once replica "
        f"in {time.monotonic() - started:.1f} s (not measured)")


def median_run(runs: list[ModeResult]) -> ModeResult:
    """The run with the median throughput (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r.records_per_s)
    return ordered[(len(ordered) - 1) // 2]


def run_scaling(bootstrap: str, run_id: str, log_dir: Path, args: argparse.Namespace,
                say: Callable[[str], None], broker_idle_cpu_per_s: float) -> list[ModeResult]:
    results = []
    for partitions in SCALING_PARTITIONS:
        w = replace(workload(bootstrap, run_id, log_dir, args, partitions),
                    broker_idle_cpu_per_s=broker_idle_cpu_per_s,
                    output_partitions=args.scaling_outputs)
        r = measure(w, "exactly_once", tag="-scaling")
        say(f"  exactly_once over {partitions} partitions: {r.records_per_s:,.0f} rec/s, "
            f"{_verdict(r)}")
        r.output_log = _output_log(w, r.output_topic)
        results.append(r)
    return results


def _output_log(w: Workload, topic: str) -> dict[str, float] | None:
    """The output topic's batches and transaction markers per 100k inputs, read from
    the private broker's log (None with --bootstrap: its log is not on this box)."""
    where = PRIVATE_LOGS.get(w.bootstrap)
    if where is None:
        return None
    return log_batches(where[0], topic, where[1]).per_100k(w.records)


def report(args: argparse.Namespace, info: dict[str, object], w: Workload,
           runs: dict[str, list[ModeResult]], scaling: list[ModeResult]) -> int:
    results = {mode: median_run(rs) for mode, rs in runs.items()}
    clean = all(r.verified and r.exit_code == 0
                for r in [*runs["exactly_once"], *runs.get(VARIANT, []), *scaling])
    workload_info = {"records": w.records, "partitions": w.partitions,
                     "value_bytes": w.value_bytes, "prefill_s": round(w.prefill_s, 2),
                     "commit_interval_ms": w.commit_interval_ms, "batch_size": BATCH_SIZE,
                     "warm_up_records": args.warm_up, "repeat": args.repeat}
    scaling_info = ({"runs": [asdict(r) for r in scaling],
                     "output_partitions": args.scaling_outputs or "as many as the input's",
                     **scaling_summary(scaling[0], scaling[1])} if scaling else None)
    summary: dict[str, object] = {
        "machine": info, "workload": workload_info,
        "modes": {m: asdict(r) for m, r in results.items()},
        "ratios": median_ratios(runs),
        "repeats": {m: [r.records_per_s for r in rs] for m, rs in runs.items()},
        "steady_repeats": {m: [r.steady_records_per_s for r in rs] for m, rs in runs.items()},
        "scaling": scaling_info, "exactly_once_verified": clean}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_human(results, scaling, summary)
    return 0 if clean else 1


def print_human(results: dict[str, ModeResult], scaling: list[ModeResult],
                summary: dict[str, object]) -> None:
    rows = [*results.values(), *scaling]
    r = summary["ratios"]
    assert isinstance(r, dict)
    lines = ["", *_table(rows), "",
             f"EOS efficiency (exactly_once / at_least_once): {r['eos_over_alo']:.3f}",
             f"exactly_once / bare:                           {r['eos_over_bare']:.3f}",
             f"at_least_once / bare:                          {r['alo_over_bare']:.3f}",
             f"  steady (10-90 % committed): exactly_once / bare {r['eos_over_bare_steady']:.3f}, "
             f"at_least_once / bare {r['alo_over_bare_steady']:.3f}",
             f"broker CPU, exactly_once / at_least_once:      "
             f"{r['broker_cpu_eos_over_alo']:.3f} (request threads only, no JIT or GC: "
             f"{r['broker_requests_cpu_eos_over_alo']:.3f})",
             *_variant_lines(r),
             *_repeat_lines(summary),
             "", "CPU-seconds per 100,000 records (measured window; broker: above idle "
             "rate):", *_cpu_lines(rows),
             *_broker_profile_lines(rows),
             "", "startup and rebalance:", *_startup_lines(rows),
             "", "memory (VmRSS) and threads (/proc/<pid>/status):", *_memory_lines(rows)]
    if scaling:
        s = summary["scaling"]
        assert isinstance(s, dict)
        lines += ["", f"pool scaling (exactly_once, 64 / 4 partitions): {s['ratio']:.3f}",
                  f"  output topics: {s['output_partitions']} partitions",
                  f"  per extra pinned producer (64 vs 4 runs, at ready): "
                  f"{_fmt(_kb_to_mb(s.get('rss_kb_per_producer_at_ready')), ' MB', 2)} RSS, "
                  f"{_fmt(s.get('threads_per_producer_at_ready'), ' threads', 2)}",
                  f"  within the 64-partition run (ready - before assignment) / 64: "
                  f"{_fmt(_kb_to_mb(s.get('rss_kb_per_producer_in_run')), ' MB', 2)} RSS, "
                  f"{_fmt(s.get('threads_per_producer_in_run'), ' threads', 2)}",
                  *(f"  output log, {r.partitions} input partitions, per 100k inputs: "
                    f"{r.output_log['data_batches']:,.0f} batches of "
                    f"{r.output_log['records_per_data_batch']:.1f} records, "
                    f"{r.output_log['markers']:,.0f} transaction markers"
                    for r in scaling if r.output_log)]
    verdict = "clean" if summary["exactly_once_verified"] else "FAILED"
    lines += ["", f"exactly-once lineage check (V1-V5) of the measured runs: {verdict}"]
    for row in rows:
        lines += [f"  {row.mode}/{row.partitions}: {p}" for p in row.problems]
    print("\n".join(lines))


def _broker_profile_lines(rows: Sequence[ModeResult]) -> list[str]:
    profiled = {f"{r.mode}/{r.partitions}": r.broker_samples_per_100k
                for r in rows if r.broker_samples_per_100k is not None}
    if not profiled:
        return []
    return ["", "the broker's time by what it did (--broker-profile; Java code only):",
            *broker_profile.lines(profiled)]


def _variant_lines(r: dict[str, float]) -> list[str]:
    if "variant_over_eos" not in r:
        return []
    return [f"variant / exactly_once, rec/s:                 {r['variant_over_eos']:.3f}",
            f"variant / exactly_once, process CPU per record: {r['variant_cpu_over_eos']:.3f}",
            f"broker CPU, variant / at_least_once:           "
            f"{r['broker_cpu_variant_over_alo']:.3f}"]


def _repeat_lines(summary: dict[str, object]) -> list[str]:
    repeats = summary["repeats"]
    assert isinstance(repeats, dict)
    if all(len(values) < 2 for values in repeats.values()):
        return []
    runs = "; ".join(f"{mode} " + ", ".join(f"{v:,.0f}" for v in values)
                     for mode, values in repeats.items())
    steady = summary["steady_repeats"]
    assert isinstance(steady, dict)
    steady_runs = "; ".join(f"{mode} " + ", ".join(_fmt(v, digits=0) for v in values)
                            for mode, values in steady.items())
    return ["(ratios: the median over rounds of each round's ratio; table: the median run)",
            f"(every run, rec/s: {runs})", f"(every run, steady rec/s: {steady_runs})"]


def _kb_to_mb(value: object) -> float | None:
    return None if not isinstance(value, int | float) else value / 1024


# ----------------------------------------------------------------------------- profile

PROFILERS = {
    # deterministic: every call counted, but Python-heavy code runs ~2.5x slower
    "cprofile",
    # sampling (wall clock, main thread): close to the real speed; pip install pyinstrument
    "pyinstrument",
}
# What the loop thread calls, broken down two levels below Loop.iterate.
_TREE = (("service/stage/loop.py", "iterate"), ("service/stage/loop.py", "process"),
         ("service/contract/processing.py", "process"),
         ("service/contract/processing.py", "_resolve"),
         ("service/stage/loop.py", "_write_run"),
         ("service/stage/guarantees/exactly_once.py", "write_run"),
         ("service/stage/guarantees/at_least_once.py", "write_run"),
         ("service/kafka/producer.py", "produce_run"),
         ("service/stage/guarantees/at_least_once.py", "poll"), ("service/stage/loop.py", "tick"))

FuncKey = tuple[str, int, str]
StatsTable = Mapping[FuncKey, tuple[int, int, float, float, dict[FuncKey, tuple[float, ...]]]]


def run_profile(w: Workload, path: Path, profiler: str, top: int,
                say: Callable[[str], None], mode: str = "exactly_once") -> int:
    """One replica (``mode``) under a profiler over the workload; print the summary."""
    path.unlink(missing_ok=True)
    argv = ("-m", "bench.profiled", profiler, str(path))
    r = measure(w, mode, argv=argv, tag=f"-{profiler}")
    say(f"profiled {mode}: {r.records_per_s:,.0f} rec/s under {profiler}, {_verdict(r)}")
    if not path.exists():
        say(f"no profile written to {path} (exit code {r.exit_code})")
        return 1
    print_profile(path, top)
    return 0 if r.verified and r.exit_code == 0 else 1


def print_profile(path: Path, top: int) -> None:
    """Inclusive time of each callee of the loop's main functions, then the top own times."""
    stats = pstats.Stats(str(path))
    table: StatsTable = stats.stats  # type: ignore[attr-defined]
    root = _find(table, *_TREE[0])
    total = table[root][3] if root else 0.0
    print(f"\nloop thread: {total:.2f} s in Loop.iterate; inclusive time per call edge")
    for file, name in _TREE:
        parent = _find(table, file, name)
        if parent is None:
            continue
        print(f"  {name} ({file}): {table[parent][3]:.2f} s")
        for seconds, calls, child in _children(table, parent)[:8]:
            share = 100 * seconds / total if total else 0.0
            print(f"    {seconds:7.2f} s {share:5.1f} % {calls:>8} calls  {_label(child)}")
    print(f"\ntop {top} functions by own time:")
    stats.sort_stats("tottime").print_stats(top)


def _find(table: StatsTable, file: str, name: str) -> FuncKey | None:
    return next((k for k in table if k[0].endswith(file) and k[2] == name), None)


def _children(table: StatsTable, parent: FuncKey) -> list[tuple[float, int, FuncKey]]:
    edges = [(float(callers[parent][3]), int(callers[parent][1]), func)
             for func, (_, _, _, _, callers) in table.items() if parent in callers]
    return sorted(edges, reverse=True)


def _label(func: FuncKey) -> str:
    file, line, name = func
    if file == "~":
        return name
    return f"{Path(file).parent.name}/{Path(file).name}:{line}({name})"


if __name__ == "__main__":
    sys.exit(main())
