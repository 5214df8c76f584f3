"""End-to-end latency of the exactly-once stage, measured from outside.

``python -m bench.latency [--rate N] [--seconds S] [--partitions P] [--commit-interval-ms M]``

A feeder appends records at a fixed rate (``--rate`` records per second, in 10 ms
steps); each value starts with the wall-clock nanoseconds at which it was handed to the
feeder's producer. One exactly-once replica (``bench.transforms:identity``, so the value
comes through unchanged) processes them, and a ``read_committed`` reader of the output
topic takes, for every output, the time it was read minus that stamp: input append →
output visible, as a downstream consumer sees it (the reader's own fetch wait included).

It prints p50/p90/p99/max of that latency over the steady part of the run (the first
``--skip-s`` seconds after the first output are left out: producers starting, the
first fetches), the rate the feeder achieved, and the stage's own
``txstage_end_to_end_seconds`` quantiles scraped at the end (histogram buckets, so
coarse). Everything runs on this machine: feeder, stage, reader and broker share its
cores.

Fail-over: ``--replicas 2 --kill-after 10`` runs two replicas and SIGKILLs the first
10 s into the feed. A record fed to one of its partitions right after the kill waits
until another replica owns the partition (the group notices the dead member after the
session timeout; the new owner's ``init_transactions`` fences the dead producer and
aborts its open transaction) and commits it; the largest latency of the records fed
after the kill is that fail-over time, as a downstream consumer sees it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import Consumer, Producer

from bench.common import ensure_topics, free_port, histogram, stage_env
from bench.replica import Replica
from bench.throughput import broker

STAMP_DIGITS = 19  # time.time_ns() until the year 2286


def feed(bootstrap: str, topic: str, rate: int, seconds: float, value_bytes: int,
         stop: threading.Event) -> tuple[int, float]:
    """Append ``rate`` records per second for ``seconds``; (records, seconds taken)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all"})
    step, per_step = 0.01, max(rate // 100, 1)
    pad = b"x" * max(value_bytes - STAMP_DIGITS, 0)
    started = time.monotonic()
    sent = 0
    deadline = started + seconds
    next_step = started
    while not stop.is_set() and time.monotonic() < deadline:
        for _ in range(per_step):
            producer.produce(topic, str(time.time_ns()).encode() + pad)
        sent += per_step
        producer.poll(0)
        next_step += step
        time.sleep(max(next_step - time.monotonic(), 0))
    producer.flush(30)
    return sent, time.monotonic() - started


Reading = tuple[float, float, float]  # (read at: monotonic, latency s, stamp: wall-clock s)


def read_latencies(bootstrap: str, topic: str, expected: threading.Event, total: list[int],
                   latencies: list[Reading], timeout_s: float) -> None:
    """(read at, latency, stamp) of every output, until ``total[0]`` were read after
    ``expected`` is set, or ``timeout_s`` passed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"latency-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if expected.is_set() and len(latencies) >= total[0]:
                return
            for msg in consumer.consume(1000, 0.05):
                if msg.error() is not None:
                    continue
                now = time.time_ns()
                stamp = int((msg.value() or b"")[:STAMP_DIGITS])
                latencies.append((time.monotonic(), (now - stamp) / 1e9, stamp / 1e9))
    finally:
        consumer.close()


def _replica(args: argparse.Namespace, bootstrap: str, run_id: str, topic: str, output: str,
             number: int, log_dir: Path) -> Replica:
    port = free_port()
    settings = {
        "TXSTAGE_BOOTSTRAP_SERVERS": bootstrap, "TXSTAGE_GROUP_ID": f"latency-{run_id}",
        "TXSTAGE_INPUT_TOPICS": topic, "TXSTAGE_OUTPUT_TOPIC": output,
        "TXSTAGE_TRANSFORM": "bench.transforms:identity",
        "TXSTAGE_COMMIT_INTERVAL_MS": str(args.commit_interval_ms),
        "TXSTAGE_LOG_FORMAT": "json", "TXSTAGE_METRICS_HOST": "127.0.0.1",
        "TXSTAGE_METRICS_PORT": str(port), "TXSTAGE_GUARANTEE": "exactly_once",
        "TXSTAGE_GROUP_PROTOCOL": args.group_protocol,
    }
    if args.group_protocol == "classic":
        settings["TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS"] = str(args.session_timeout_ms)
    return Replica(f"replica-{number}", stage_env(settings),
                   log_dir / f"replica-{number}.log", port).start()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--rate", type=int, default=20_000, help="input records per second")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--skip-s", type=float, default=3.0, help="warm-up left out")
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: start one)")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--kill-after", type=float, default=None, metavar="S",
                        help="SIGKILL the first replica S seconds into the feed")
    parser.add_argument("--group-protocol", choices=("classic", "consumer"), default="classic")
    parser.add_argument("--session-timeout-ms", type=int, default=10_000,
                        help="classic protocol (the consumer protocol's is the broker's: 6 s)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run_id = uuid.uuid4().hex[:6]
    log_dir = Path(tempfile.mkdtemp(prefix=f"txstage-latency-{run_id}-"))
    killed_at: list[float] = []  # wall-clock seconds
    total: list[int] = [0]
    latencies: list[Reading] = []
    with broker(args.bootstrap, print) as bootstrap:
        topic, output = f"latency-{run_id}-in", f"latency-{run_id}-out"
        ensure_topics(bootstrap, {topic: args.partitions, output: args.partitions})
        replicas = [_replica(args, bootstrap, run_id, topic, output, number, log_dir)
                    for number in range(args.replicas)]

        def kill_first() -> None:
            killed_at.append(time.time())
            replicas[0].kill()
        killer = threading.Timer(args.kill_after or 0.0, kill_first)
        try:
            for replica in replicas:
                replica.wait_ready(60)
            if args.replicas > 1:
                time.sleep(3.0)  # the group settles on its assignment
            expected = threading.Event()
            reader = threading.Thread(target=read_latencies, daemon=True, args=(
                bootstrap, output, expected, total, latencies, args.seconds + 120))
            reader.start()
            if args.kill_after is not None:
                killer.start()
            sent, took = feed(bootstrap, topic, args.rate, args.seconds, args.value_bytes,
                              threading.Event())
            total[0] = sent
            expected.set()
            reader.join(args.seconds + 130)
            scraped = replicas[-1].scrape()
        finally:
            killer.cancel()
            codes = [replica.stop() for replica in replicas[1 if killed_at else 0:]]
    return report(args, run_id, log_dir, codes, latencies, sent, took, killed_at, scraped)


def report(args: argparse.Namespace, run_id: str, log_dir: Path, codes: list[int],
           latencies: list[Reading], sent: int, took: float, killed_at: list[float],
           scraped: str) -> int:
    print(f"txstage latency {run_id}: {args.partitions} partitions, {args.replicas} "
          f"replica(s), {args.group_protocol} protocol, {args.value_bytes} B values, "
          f"commit interval {args.commit_interval_ms} ms; exit codes {codes}; "
          f"logs in {log_dir}")
    if not latencies:
        print("no output read")
        return 1
    print(f"fed {sent:,} records in {took:.1f} s = {sent / took:,.0f} rec/s "
          f"(asked {args.rate:,}); read {len(latencies):,} outputs")
    first_read = latencies[0][0]
    steady = [latency for at, latency, _ in latencies if at - first_read >= args.skip_s]
    print(f"end to end (input append -> output read, read_committed), "
          f"{len(steady):,} outputs after the first {args.skip_s:.0f} s:")
    cuts = statistics.quantiles(steady, n=100, method="inclusive")  # p1..p99
    figures = {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98], "max": max(steady),
               "mean": statistics.fmean(steady)}
    print("  " + "   ".join(f"{name} {seconds * 1000:7.1f} ms"
                            for name, seconds in figures.items()))
    if killed_at:
        session = (args.session_timeout_ms / 1000 if args.group_protocol == "classic"
                   else 6.0)
        after = [latency for _, latency, stamp in latencies if stamp >= killed_at[0]]
        print(f"fail-over after the SIGKILL: the largest latency of a record fed after it "
              f"{max(after, default=0.0):.2f} s (session timeout {session:.0f} s)")
    for record in ("first", "last"):
        h = histogram(scraped, "txstage_end_to_end_seconds", record=record)
        p50, p99 = h.quantile(0.5), h.quantile(0.99)
        if p50 is not None and p99 is not None:
            print(f"  the stage's txstage_end_to_end_seconds{{record={record}}}: "
                  f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms (all transactions, "
                  f"bucket-interpolated)")
    complete = len(latencies) >= sent
    if not complete:
        print(f"only {len(latencies):,} of {sent:,} outputs were read")
    return 0 if complete and all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
