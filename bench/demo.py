"""``make demo``: the stage end to end on the local broker, then the exactly-once verdict.

Starts (or reuses) the local Kafka on 127.0.0.1:9092, creates the demo topics, runs an
input generator (integers, now and then a poison value) and two replicas of the stage
with the ``square`` example, and prints a status line per second. On Ctrl-C or after
``--seconds``: stops the generator, lets the replicas finish the backlog, SIGTERMs them
(they commit and exit 0), and checks V1-V5 over everything in the demo topics. Exit 0
when clean. The broker keeps running (``make kafka-down`` stops it). See docs/demo.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from bench.common import (
    REPO_ROOT,
    behind,
    ensure_topics,
    histogram,
    metric_value,
    offset_probe,
    partitions_of,
    port_taken,
    stage_env,
)
from bench.keyboard import ctrl_c_as_a_key
from bench.replica import Replica
from service.examples.square import square
from service.kafka.reading import HangingTransactionError
from service.tools.verify import Report, verify

BOOTSTRAP = "127.0.0.1:9092"
INPUT, OUTPUT, DLQ = "txstage-demo-in", "txstage-demo-out", "txstage-demo-dlq"
GROUP = "txstage-demo"
TOPICS = {INPUT: 8, OUTPUT: 8, DLQ: 1}
TRANSFORM = "service.examples.square:square"
LOG_DIR = REPO_ROOT / "var" / "demo"
POISON_EVERY = 97  # every 97th input is b"oops": square raises, the record is dead-lettered
DRAIN_TIMEOUT_S = 60.0
SESSION_TIMEOUT_MS = 10_000


# ------------------------------------------------------------------------- background


class Generator(threading.Thread):
    """Produces ``rate`` integers a second to the input topic (key ``k<i>``)."""

    def __init__(self, rate: float) -> None:
        super().__init__(name="demo-generator", daemon=True)
        self.rate = rate
        self.produced = 0
        self.poison = 0
        self.stopping = threading.Event()
        self._producer = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True,
                                   "linger.ms": 5})
        self._next = int(time.time() * 1000)  # distinct values from one run to the next

    def run(self) -> None:
        tick, began, sent = 0.05, time.monotonic(), 0
        while not self.stopping.wait(tick):
            due = int((time.monotonic() - began) * self.rate)
            while sent < due:
                self._send()
                sent += 1
            self._producer.poll(0)

    def _send(self) -> None:
        i = self._next
        self._next += 1
        poison = i % POISON_EVERY == 0
        value = b"oops" if poison else str(i).encode()
        while True:
            try:
                self._producer.produce(INPUT, value, f"k{i}".encode())
                break
            except BufferError:
                self._producer.poll(0.1)
        self.produced += 1
        self.poison += poison

    def stop(self) -> int:
        """Stop, deliver what is queued; returns how many records are still undelivered."""
        self.stopping.set()
        if self.is_alive():
            self.join()
        return int(self._producer.flush(15))


class Reader(threading.Thread):
    """Counts outputs and dead letters as a read_committed consumer sees them,
    from the end offsets at start (so only this run's)."""

    def __init__(self) -> None:
        super().__init__(name="demo-reader", daemon=True)
        self.counts = {OUTPUT: 0, DLQ: 0}
        self.stopping = threading.Event()
        self._consumer = Consumer({"bootstrap.servers": BOOTSTRAP,
                                   "group.id": "txstage-demo-reader",
                                   "isolation.level": "read_committed",
                                   "enable.auto.commit": False})
        keys = [key for topic in (OUTPUT, DLQ) for key in partitions_of(BOOTSTRAP, topic)]
        with offset_probe(BOOTSTRAP) as probe:
            ends = probe.end_offsets(keys)
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in ends.items()])

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                for msg in self._consumer.consume(1000, 0.2):
                    error = msg.error()
                    if error is None:
                        self.counts[str(msg.topic())] += 1
                    elif error.code() != KafkaError._PARTITION_EOF:
                        print(f"reader: {error}", file=sys.stderr)
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(10)


# ---------------------------------------------------------------------------- setup


def ensure_broker() -> None:
    """``txstage kafka up``: installs and starts it if needed (idempotent)."""
    from service.local_kafka.cli import main as local_kafka

    if local_kafka(["up"]) != 0:
        raise SystemExit("demo: the local Kafka could not be started (see above)")


def start_replicas(first_port: int) -> list[Replica]:
    ports = [first_port, first_port + 1]
    taken = [port for port in ports if port_taken(port)]
    if taken:
        raise SystemExit(f"demo: port(s) {taken} already in use; is a replica still running? "
                         f'(pgrep -fa "service run") or pass --first-port')
    replicas = []
    for n, port in enumerate(ports, start=1):
        env = stage_env({
            "TXSTAGE_BOOTSTRAP_SERVERS": BOOTSTRAP, "TXSTAGE_GROUP_ID": GROUP,
            "TXSTAGE_INPUT_TOPICS": INPUT, "TXSTAGE_OUTPUT_TOPIC": OUTPUT,
            "TXSTAGE_DLQ_TOPIC": DLQ, "TXSTAGE_TRANSFORM": TRANSFORM,
            "TXSTAGE_LOG_FORMAT": "console", "TXSTAGE_METRICS_HOST": "127.0.0.1",
            "TXSTAGE_METRICS_PORT": str(port),
            # A killed replica's partitions move after 10 s instead of the default 45 s.
            "TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
            "TXSTAGE_CONSUMER__HEARTBEAT_INTERVAL_MS": "1000",
        })
        replicas.append(Replica(f"replica-{n}", env, LOG_DIR / f"replica-{n}.log",
                                port).start())
    return replicas


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def print_banner(replicas: list[Replica], rate: float, seconds: float | None) -> None:
    lines = [f"txstage demo: Kafka at {BOOTSTRAP} (left running; `make kafka-down` stops it)",
             f"  {INPUT} (8 partitions) --square--> {OUTPUT} (8), dead letters -> {DLQ} (1), "
             f"group {GROUP}",
             f"  generator: {rate:g} integers/s, every {POISON_EVERY}th value is b\"oops\" "
             f"(the transform raises: dead letter)"]
    for r in replicas:
        base = f"http://127.0.0.1:{r.port}"
        lines += [f"  {r.name} (pid {r.pid}): {base}/metrics  {base}/healthz  {base}/readyz",
                  f"      tail -f {_shown(r.log_path)}"]
    until = f"for {seconds:g} s" if seconds is not None else "until Ctrl-C"
    lines.append(f"running {until}; then the replicas get SIGTERM and everything is verified")
    print("\n".join(lines), flush=True)


# ---------------------------------------------------------------------------- watch


@dataclass
class Status:
    """What one status line shows."""

    elapsed: float
    produced: int
    poison: int
    outputs: int
    dead_letters: int
    pending: int | None
    replicas: list[str]

    def line(self) -> str:
        pending = "?" if self.pending is None else str(self.pending)
        return (f"[{self.elapsed:5.0f}s] in {self.produced:>7} ({self.poison} poison) | "
                f"committed out {self.outputs:>7} dlq {self.dead_letters:>4} | "
                f"backlog {pending:>5} | " + " | ".join(self.replicas))


def replica_summary(r: Replica) -> str:
    if not r.alive():
        return f"{r.name}: exited {r.returncode()}"
    text = r.scrape()
    if not text:
        return f"{r.name}: not answering"  # starting, or stopped (SIGSTOP)
    pinned = metric_value(text, "txstage_pinned_producers")
    p50 = histogram(text, "txstage_transaction_commit_seconds").quantile(0.5)
    commit = "-" if p50 is None else f"{p50 * 1000:.1f} ms"
    return f"{r.name}: {int(pinned or 0)} partitions, commit p50 {commit}"


class Watch:
    """Builds a status line from the generator, the reader, the group and the replicas."""

    def __init__(self, generator: Generator, reader: Reader,
                 replicas: list[Replica]) -> None:
        self.generator, self.reader, self.replicas = generator, reader, replicas
        self.began = time.monotonic()
        self.probe = offset_probe(BOOTSTRAP, GROUP)
        self.keys = partitions_of(BOOTSTRAP, INPUT)

    def backlog(self) -> int | None:
        try:
            return behind(self.probe.end_offsets(self.keys), self.probe.committed(self.keys))
        except Exception:  # a status line must not end the demo
            return None

    def status(self) -> Status:
        return Status(time.monotonic() - self.began, self.generator.produced,
                      self.generator.poison, self.reader.counts[OUTPUT],
                      self.reader.counts[DLQ], self.backlog(),
                      [replica_summary(r) for r in self.replicas])

    def close(self) -> None:
        self.probe.close()


def watch(w: Watch, stop: threading.Event, seconds: float | None) -> None:
    """Print a line a second until ``stop``, ``seconds`` or no replica is left."""
    deadline = None if seconds is None else time.monotonic() + seconds
    announced: set[str] = set()
    while not stop.wait(1.0):
        print(w.status().line(), flush=True)
        for r in w.replicas:
            if not r.alive() and r.name not in announced:
                announced.add(r.name)
                print(f"{r.name} exited with {r.returncode()}; its partitions move to the "
                      "other replica", flush=True)
        if len(announced) == len(w.replicas):
            print("no replica left; stopping", flush=True)
            return
        if deadline is not None and time.monotonic() >= deadline:
            return


def drain(w: Watch) -> bool:
    """With the generator stopped, wait until the group has committed every input."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline and any(r.alive() for r in w.replicas):
        status = w.status()
        if status.pending == 0:
            print(status.line(), flush=True)
            return True
        print(status.line() + "  (draining)", flush=True)
        time.sleep(1.0)
    print("the backlog did not drain", flush=True)
    return False


# ---------------------------------------------------------------------------- verdict

CHECKS = (
    ("V1", "no output written twice"),
    ("V2", "every input below the committed offsets has its outputs; offsets at the end"),
    ("V3", "per input partition, outputs in offset order"),
    ("V4", "nothing from an aborted attempt is visible; outputs match the transform"),
    ("V5", "no transaction left hanging (read_committed reaches every high watermark)"),
)


def check_results(report: Report | None) -> dict[str, list[str]]:
    """Problems per check (an empty list: the check passed)."""
    if report is None:
        return {code: [] for code, _ in CHECKS}
    return {
        "V1": [str(k) for k in report.duplicates[:5]],
        "V2": [str(k) for k in report.missing[:5]] + [f"{tp}: committed {c} < end {e}"
                                                      for tp, (c, e) in report.behind.items()],
        "V3": report.out_of_order[:5],
        "V4": [str(k) for k in (report.unexpected + report.mismatched)[:5]]
        # Written at write time or by txstage redrive: the audit judges those.
        + ([f"{len(report.unjudged)} records not judged here: run txstage audit"]
           if report.unjudged else []),
        "V5": [],
    }


def verdict() -> bool:
    """Run service.tools.verify over the demo topics and print V1-V5."""
    print("verifying everything in the demo topics (read_committed) ...", flush=True)
    began = time.monotonic()
    report: Report | None = None
    try:
        report = verify(BOOTSTRAP, input_topics=[INPUT], output_topics=[OUTPUT, DLQ],
                        group_id=GROUP, transform=square, default_topic=OUTPUT,
                        dlq_topic=DLQ, timeout_s=60)
        problems = check_results(report)
    except HangingTransactionError as exc:
        problems = {**check_results(None), "V5": [str(exc)]}
    for code, text in CHECKS:
        found = problems[code]
        print(f"  {code} {text}: {'ok' if not found else 'FAILED ' + '; '.join(found)}")
    clean = not any(problems.values())
    if report is not None:
        print(f"  {report.found} outputs and dead letters checked against {report.expected} "
              f"expected, in {time.monotonic() - began:.1f} s")
    print(f"exactly-once: {'CLEAN' if clean else 'VIOLATED'}", flush=True)
    return clean


# ------------------------------------------------------------------------------ main


def install_signals(stop: threading.Event) -> None:
    """First Ctrl-C/SIGTERM: stop gracefully. Second: quit without verifying (replicas
    still get SIGTERM, and SIGKILL after a short grace)."""
    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        print(f"\n{signal.Signals(signum).name}: stopping (press Ctrl-C again to quit "
              "without verifying)", flush=True)
        stop.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


def stop_replicas(replicas: list[Replica], grace: float) -> list[int]:
    """SIGTERM every replica at once, then wait; exit codes."""
    for r in replicas:
        r.request_stop()
    return [r.stop(grace) for r in replicas]


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    ensure_broker()
    created = ensure_topics(BOOTSTRAP, TOPICS)
    if created:
        print(f"created topics: {', '.join(created)}")
    if stop.is_set():
        return 130
    replicas = start_replicas(args.first_port)
    generator: Generator | None = None
    reader: Reader | None = None
    w: Watch | None = None
    try:
        print_banner(replicas, args.rate, args.seconds)
        reader = Reader()
        reader.start()
        generator = Generator(args.rate)
        generator.start()
        w = Watch(generator, reader, replicas)
        watch(w, stop, args.seconds)
        return finish(w, generator, replicas)
    finally:
        if generator is not None:
            generator.stop()
        stop_replicas(replicas, 5)
        if reader is not None:
            reader.stop()
        if w is not None:
            w.close()


def finish(w: Watch, generator: Generator, replicas: list[Replica]) -> int:
    """Stop the input, drain, SIGTERM the replicas, verify: the exit code."""
    undelivered = generator.stop()
    print(f"generator stopped: {generator.produced} inputs "
          f"({generator.poison} poison, {undelivered} undelivered)", flush=True)
    drained = drain(w)
    codes = stop_replicas(replicas, 60)
    print(f"replicas stopped: exit codes {codes}", flush=True)
    clean = verdict()
    return 0 if clean and drained and codes == [0] * len(codes) else 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=None,
                        help="stop after this long (default: run until Ctrl-C)")
    parser.add_argument("--rate", type=float, default=200.0, help="input records per second")
    parser.add_argument("--first-port", type=int, default=9108,
                        help="metrics port of the first replica; the second uses the next one")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    install_signals(stop)
    with ctrl_c_as_a_key(sys.stdin.fileno()):
        try:
            return run(args, stop)
        except KeyboardInterrupt:
            print("interrupted twice: replicas stopped, nothing verified", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
