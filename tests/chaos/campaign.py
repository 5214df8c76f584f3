"""A chaos campaign against real brokers: ``make chaos CHAOS_ARGS="--seed 7 ..."``.

``python -m tests.chaos.campaign --seed S --duration SECONDS --nodes 1|3
--guarantee exactly_once|at_least_once --group-protocol classic|consumer --replicas N
--workers N --transactions per_partition|spanning``

1. Start a private cluster whose client listeners sit behind the fault proxy
   (tests/harness/proxy.py); replicas of the stage talk through it, the feeder and
   the checks past it.
2. Feed unique, ordered records (value = sequence number, key ``k<i mod 64>``, always
   the same input partition per key) at a steady rate, to ``--replicas`` replicas
   running ``tests.harness.transforms:chaos``.
3. Every ``--interval`` seconds apply a fault drawn from the seed (tests/chaos/faults.py)
   and print it; each fault heals itself (restart, resume, expire).
4. Then heal everything, stop feeding, and check: everything committed within
   ``--drain-timeout`` after the last fault (exactly-once: V1-V5 of service.tools.verify,
   i.e. no duplicate, nothing lost, order per input partition, nothing from an aborted
   transaction, no hanging transaction; at-least-once: nothing lost), every replica
   stops with exit 0 on SIGTERM, and every non-zero exit was caused by a fault.

Exit code 0 when every check passed, 1 otherwise. The same seed replays the same
faults at the same moments (timing in the system under test still varies).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from service.exit_codes import ExitCode
from service.kafka.reading import HangingTransactionError
from service.local_kafka.cluster import KafkaCluster
from service.local_kafka.readiness import wait_ready
from service.tools.verify import committed_offsets, end_offsets, verify
from tests.chaos.faults import LIBRARY, WORKERS_ONLY, Later
from tests.harness.admin import create_topic
from tests.harness.proxy import FaultProxy
from tests.harness.stage import Replica
from tests.harness.transforms import chaos_expected

PARTITIONS = 8
KEYS = 64
SESSION_TIMEOUT_S = 6.0        # classic: the replicas' setting; consumer: the test broker's
TRANSACTION_TIMEOUT_S = 10.0
MAX_POLL_INTERVAL_S = 15.0
# Between the transaction time-out and the poll interval: a stall past the first still
# meets the coordinator's abort, one past the second is an overrun (exit 5, in-process).
TRANSFORM_TIMEOUT_S = 12.0
Say = Callable[[str], None]


@dataclass
class World:
    """Everything a fault may act on."""

    cluster: KafkaCluster
    proxy: FaultProxy
    env: dict[str, str]
    log_dir: Path
    replicas: int
    stall_file: str
    session_timeout_s: float = SESSION_TIMEOUT_S
    transaction_timeout_s: float = TRANSACTION_TIMEOUT_S
    max_poll_interval_s: float = MAX_POLL_INTERVAL_S
    started: list[Replica] = field(default_factory=list)
    extras: set[str] = field(default_factory=set)
    left: set[str] = field(default_factory=set)  # scaled down: not restarted
    paused_replicas: set[str] = field(default_factory=set)
    expected_exits: dict[int, int] = field(default_factory=dict)  # pid -> exit code
    exits: list[tuple[str, int, int, bool]] = field(default_factory=list)  # name,pid,code,ok
    agenda: list[Later] = field(default_factory=list)
    _names: int = 0

    def add_replica(self, extra: bool = True) -> Replica:
        self._names += 1
        replica = Replica(f"r{self._names}", self.env, self.log_dir).start()
        self.started.append(replica)
        if extra:
            self.extras.add(replica.name)
        return replica

    def restart(self, replica: Replica) -> None:
        """Start it again once it has exited (as an orchestrator would)."""
        self.collect_exits()
        if not replica.alive():
            replica.start()
        elif replica.proc is not None and replica.proc.pid in self.expected_exits:
            self.later(1, f"restart {replica.name}", lambda: self.restart(replica))

    def live_replicas(self) -> list[Replica]:
        return [r for r in self.started if r.alive()]

    def pick_replica(self, rng: random.Random) -> Replica | None:
        ready = [r for r in self.live_replicas() if r.name not in self.paused_replicas
                 and r.proc is not None and r.proc.pid not in self.expected_exits]
        return rng.choice(ready) if ready else None

    def expect_exit(self, replica: Replica, code: int) -> None:
        assert replica.proc is not None
        self.expected_exits[replica.proc.pid] = code

    def later(self, delay: float, what: str, action: Callable[[], object]) -> None:
        heapq.heappush(self.agenda, Later(time.monotonic() + delay, what, action))

    def run_due(self, now: float, say: Say) -> None:
        while self.agenda and self.agenda[0].at <= now:
            item = heapq.heappop(self.agenda)
            try:
                item.action()
            except Exception as exc:  # a heal that failed is retried
                say(f"  ! {item.what} failed ({exc}); retrying in 2 s")
                self.later(2, item.what, item.action)

    def collect_exits(self) -> None:
        """Record every replica that exited since the last look, and whether a fault
        explains its exit code."""
        for replica in self.started:
            proc = replica.proc
            if proc is None or proc.poll() is None or any(p == proc.pid for _, p, _, _ in
                                                          self.exits):
                continue
            expected = self.expected_exits.get(proc.pid)
            overran = proc.returncode == ExitCode.TRANSFORM_TIMED_OUT and expected is None
            self.exits.append((replica.name, proc.pid, proc.returncode,
                               proc.returncode in (0, expected) or overran))
            if overran:  # a transform call past its time-out: restarted, as by its orchestrator
                self.later(1, f"restart {replica.name}", lambda r=replica: self.restart(r))


@dataclass
class Feeder:
    """Unique, ordered records at a steady rate, on a thread of their own."""

    bootstrap: str
    topic: str
    rate: int
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "linger.ms": 5})
        tick = 0.05
        per_tick = max(1, int(self.rate * tick))
        next_at = time.monotonic()
        while not self.stop.is_set():
            for _ in range(per_tick):
                i = self.sent
                key = i % KEYS
                while True:
                    try:
                        producer.produce(self.topic, str(i).encode(), f"k{key}".encode(),
                                         partition=key % PARTITIONS)
                        break
                    except BufferError:
                        producer.poll(0.1)
                self.sent += 1
            producer.poll(0)
            next_at += tick
            time.sleep(max(0.0, next_at - time.monotonic()))
        if producer.flush(60) != 0:
            raise RuntimeError("the feeder could not deliver its records")


@dataclass
class Outcome:
    seed: int
    faults: list[str] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    details: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def run_campaign(*, seed: int, duration_s: float, nodes: int, guarantee: str,
                 group_protocol: str, replicas: int, interval_s: float, rate: int,
                 drain_timeout_s: float, faults: list[str] | None = None,
                 workers: int = 0, transactions: str = "per_partition",
                 say: Say = print) -> Outcome:
    names = sorted(faults or [name for name in LIBRARY if workers or name not in WORKERS_ONLY])
    outcome = Outcome(seed)
    log_dir = Path(tempfile.mkdtemp(prefix=f"txstage-chaos-{seed}-"))
    say(f"chaos seed={seed} duration={duration_s:.0f}s nodes={nodes} guarantee={guarantee} "
        f"protocol={group_protocol} replicas={replicas} workers={workers} "
        f"transactions={transactions} "
        f"faults={','.join(names)}; logs {log_dir}")
    with KafkaCluster(nodes, proxied=True) as cluster:
        proxy = FaultProxy(cluster.proxy_routes).start()
        world: World | None = None
        try:
            wait_ready(cluster.bootstrap, broker_ids=set(cluster.node_ids), timeout=60)
            world, topics = _set_up(cluster, proxy, log_dir, guarantee, group_protocol, replicas,
                                    workers, transactions)
            feeder = Feeder(cluster.direct_bootstrap, topics.input, rate)
            feeding = threading.Thread(target=feeder.run, daemon=True)
            feeding.start()
            progress = _Progress(cluster.direct_bootstrap, topics.group, topics.input)
            last_fault = _inject(world, progress, random.Random(seed), names, duration_s,
                                 interval_s, outcome, say)
            say(f"  healing: {len(world.agenda)} pending heal(s), then stop feeding")
            _heal(world, say)
            feeder.stop.set()
            feeding.join(90)
            healed = time.monotonic()
            progress.stop.set()
            drained = _drain(world, progress, drain_timeout_s, say)
            outcome.details["records"] = feeder.sent
            outcome.details["drain_s_after_heal"] = round(time.monotonic() - healed, 1)
            outcome.details["drain_s_after_last_fault"] = round(time.monotonic() - last_fault, 1)
            outcome.details["longest_stall_s"] = round(progress.longest_stall, 1)
            outcome.checks["everything committed within the drain time-out"] = drained
            _stop_replicas(world, outcome)
            _check_outputs(outcome, cluster.direct_bootstrap, topics, guarantee)
            if not outcome.ok:
                outcome.details["logs"] = str(log_dir)
                outcome.details["replica_tails"] = {
                    r.name: r.diagnosis(30) for r in world.started}
        finally:
            for replica in world.started if world else []:
                replica.kill()
            proxy.stop()
    return outcome


@dataclass(frozen=True)
class Topics:
    input: str
    output: str
    dlq: str
    group: str


def _set_up(cluster: KafkaCluster, proxy: FaultProxy, log_dir: Path, guarantee: str,
            group_protocol: str, replicas: int, workers: int = 0,
            transactions: str = "per_partition") -> tuple[World, Topics]:
    run_id = uuid.uuid4().hex[:6]
    direct = cluster.direct_bootstrap
    topics = Topics(create_topic(direct, f"chaos-in-{run_id}", partitions=PARTITIONS),
                    create_topic(direct, f"chaos-out-{run_id}", partitions=4),
                    create_topic(direct, f"chaos-dlq-{run_id}", partitions=1),
                    f"chaos-{run_id}")
    env = {
        "TXSTAGE_BOOTSTRAP_SERVERS": cluster.bootstrap, "TXSTAGE_GROUP_ID": topics.group,
        "TXSTAGE_INPUT_TOPICS": topics.input, "TXSTAGE_OUTPUT_TOPIC": topics.output,
        "TXSTAGE_DLQ_TOPIC": topics.dlq, "TXSTAGE_GUARANTEE": guarantee,
        "TXSTAGE_TRANSACTIONS": transactions,
        "TXSTAGE_TRANSFORM": "tests.harness.transforms:chaos",
        "TXSTAGE_LOG_FORMAT": "json", "TXSTAGE_GROUP_PROTOCOL": group_protocol,
        "TXSTAGE_TRANSACTION_TIMEOUT_MS": str(int(TRANSACTION_TIMEOUT_S * 1000)),
        "TXSTAGE_CONSUMER__MAX_POLL_INTERVAL_MS": str(int(MAX_POLL_INTERVAL_S * 1000)),
        "TXSTAGE_TRANSFORM_TIMEOUT_MS": str(int(TRANSFORM_TIMEOUT_S * 1000)),
        "TXSTAGE_MAX_RECORD_ATTEMPTS": "2",
        "TEST_STALL_FILE": str(log_dir / "stall"),
        "TEST_SLOW_FILE": str(log_dir / "slow"),
    }
    if workers:
        env["TXSTAGE_WORKERS"] = str(workers)
    if group_protocol == "classic":
        env |= {"TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS": str(int(SESSION_TIMEOUT_S * 1000)),
                "TXSTAGE_CONSUMER__HEARTBEAT_INTERVAL_MS": "500"}
    world = World(cluster, proxy, env, log_dir, replicas, env["TEST_STALL_FILE"])
    for _ in range(replicas):
        world.add_replica(extra=False)
    return world, topics


def _inject(world: World, progress: _Progress, rng: random.Random, names: list[str],
            duration_s: float, interval_s: float, outcome: Outcome, say: Say) -> float:
    """Apply a drawn fault every ``interval_s`` (± 50 %) for ``duration_s``; the time of
    the last one applied."""
    started = time.monotonic()
    next_fault, last_fault = started + interval_s, started
    while time.monotonic() - started < duration_s:
        now = time.monotonic()
        world.run_due(now, say)
        world.collect_exits()
        if now >= next_fault:
            name = rng.choice(names)
            description = LIBRARY[name](world, rng)
            stamp = f"t+{now - started:5.1f}s"
            if description is None:
                say(f"  {stamp} {name}: does not apply now")
            else:
                outcome.faults.append(f"{stamp} {name}: {description}")
                say(f"  {stamp} {name}: {description}")
                last_fault = now
            next_fault = now + interval_s * rng.uniform(0.5, 1.5)
        time.sleep(0.2)
    return last_fault


def _stop_replicas(world: World, outcome: Outcome) -> None:
    outcome.details["aborts_by_reason"] = _aborts(world.log_dir)
    stopped = [(r, r.terminate(90)) for r in world.live_replicas()]
    world.collect_exits()
    # A stalled transform call that passes its time-out as the stop comes exits 5 by
    # design (the call cannot be stopped): the fault's doing, not the stop's.
    outcome.checks["every replica stops with exit 0 on SIGTERM"] = all(
        code == 0 or (code == ExitCode.TRANSFORM_TIMED_OUT and r.events("transform.timed_out"))
        for r, code in stopped)
    unexplained = [f"{n} (pid {p}) exit {c}" for n, p, c, ok in world.exits if not ok]
    outcome.details["exits"] = [f"{n} (pid {p}) exit {c}" for n, p, c, _ in world.exits]
    outcome.checks["every non-zero exit was caused by a fault"] = not unexplained
    if unexplained:
        outcome.details["unexplained_exits"] = unexplained


class _Progress:
    """The group's committed offsets seen from outside: progress and the longest time
    without any while records were waiting. Sampled on a thread of its own (a paused
    broker makes each look wait), every 2 s."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.last_total = -1
        self.last_change = time.monotonic()
        self.longest_stall = 0.0
        self._next = 0.0
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self.stop.wait(2.0):
            self.sample(time.monotonic(), force=True)

    def sample(self, now: float, force: bool = False) -> bool | None:
        """Sample at most every 2 s; True once committed reaches the end."""
        if not force and now < self._next:
            return None
        self._next = now + 2.0
        try:
            ends = end_offsets(self.bootstrap, [self.topic])
            committed = committed_offsets(self.bootstrap, self.group, [self.topic])
        except KafkaException:
            return None
        total = sum(committed.get(k, 0) for k in ends)
        done = all(committed.get(k, -1) >= end for k, end in ends.items() if end > 0)
        if total != self.last_total:
            self.last_total, self.last_change = total, now
        elif not done:
            self.longest_stall = max(self.longest_stall, now - self.last_change)
        return done


def _heal(world: World, say: Say) -> None:
    deadline = time.monotonic() + 120
    while world.agenda and time.monotonic() < deadline:
        world.run_due(time.monotonic(), say)
        time.sleep(0.2)
    world.proxy.clear()
    world.cluster.heal()
    for replica in world.started:
        if replica.alive() and replica.name in world.paused_replicas:
            replica.signal(signal.SIGCONT)
    world.collect_exits()
    for replica in world.started:
        if not replica.alive() and replica.name not in world.left:
            replica.start()
    Path(world.stall_file).unlink(missing_ok=True)
    (world.log_dir / "slow").unlink(missing_ok=True)


def _drain(world: World, progress: _Progress, timeout_s: float, say: Say) -> bool:
    """Until everything is committed: the orchestrator's part goes on meanwhile (a
    replica that exits for a fault, e.g. an overrun of the transform, is restarted)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if progress.sample(time.monotonic(), force=True):
            return True
        world.run_due(time.monotonic(), say)
        world.collect_exits()
        time.sleep(1)
    return False


def _aborts(log_dir: Path) -> dict[str, int]:
    """Aborts by reason over every replica process of the run (their logs: the
    metrics of replicas killed on the way are gone), fences included."""
    total: Counter[str] = Counter()
    for path in sorted(log_dir.glob("*.log")):
        for raw in path.read_text(errors="replace").splitlines():
            if '"transaction.aborted"' not in raw and '"producer.fenced"' not in raw \
                    and '"record.poison"' not in raw:
                continue
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                continue
            event = line.get("event")
            if event == "transaction.aborted":
                total[str(line.get("reason"))] += 1
            elif event == "producer.fenced":
                total["fenced"] += 1
            elif event == "record.poison":
                total["poison"] += 1
    return dict(sorted(total.items()))


def _check_outputs(outcome: Outcome, bootstrap: str, topics: Topics, guarantee: str) -> None:
    try:
        report = verify(bootstrap, input_topics=[topics.input],
                        output_topics=[topics.output, topics.dlq], group_id=topics.group,
                        transform=chaos_expected, default_topic=topics.output,
                        dlq_topic=topics.dlq,
                        timeout_s=120)
    except HangingTransactionError as exc:
        outcome.checks["no hanging transaction"] = False
        outcome.details["hanging"] = str(exc)
        return
    outcome.details["inputs_checked"] = report.expected
    problems = report.problems()
    outcome.details["problems"] = problems[:20]
    if guarantee == "exactly_once":
        outcome.checks["exactly once (V1-V5: no duplicate, no loss, order, nothing "
                       "aborted visible, no hanging transaction)"] = report.ok
    else:
        outcome.checks["at least once (nothing lost)"] = not report.missing and not report.behind
    outcome.checks["something was checked"] = report.expected > 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=120, help="seconds of faults")
    parser.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    parser.add_argument("--guarantee", choices=("exactly_once", "at_least_once"),
                        default="exactly_once")
    parser.add_argument("--group-protocol", choices=("classic", "consumer"), default="classic")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--interval", type=float, default=8.0,
                        help="mean seconds between faults")
    parser.add_argument("--rate", type=int, default=1000, help="input records per second")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--faults", default="", help="comma-separated subset of: "
                        + ",".join(sorted(LIBRARY)))
    parser.add_argument("--workers", type=int, default=0,
                        help="TXSTAGE_WORKERS of every replica (0: the transform in-process)")
    parser.add_argument("--transactions", choices=("per_partition", "spanning"),
                        default="per_partition", help="TXSTAGE_TRANSACTIONS of every replica")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    chosen = [f for f in args.faults.split(",") if f] or None
    unknown = set(chosen or ()) - set(LIBRARY)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    outcome = run_campaign(seed=args.seed, duration_s=args.duration, nodes=args.nodes,
                           guarantee=args.guarantee, group_protocol=args.group_protocol,
                           replicas=args.replicas, interval_s=args.interval, rate=args.rate,
                           drain_timeout_s=args.drain_timeout, faults=chosen,
                           workers=args.workers, transactions=args.transactions,
                           say=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps({"seed": outcome.seed, "ok": outcome.ok, "faults": outcome.faults,
                          "checks": outcome.checks, "details": outcome.details}, indent=2))
    else:
        print(report_text(outcome))
    return 0 if outcome.ok else 1


def report_text(outcome: Outcome) -> str:
    lines = [f"seed {outcome.seed}: {'PASSED' if outcome.ok else 'FAILED'}",
             f"faults applied ({len(outcome.faults)}):", *(f"  {f}" for f in outcome.faults),
             "checks:", *(f"  [{'ok' if ok else 'FAIL'}] {name}"
                          for name, ok in outcome.checks.items())]
    for key, value in outcome.details.items():
        if key == "replica_tails":
            for name, tail in value.items():  # type: ignore[attr-defined]
                lines += [f"--- {name}", tail]
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
