"""The fault library a chaos campaign draws from.

Every fault is a function ``(world, rng) -> description | None`` that applies itself
at once and schedules its own healing (a killed replica is restarted as an
orchestrator would, a paused broker resumed, a proxy fault expires); ``None`` means it
did not apply now (e.g. no replica to kill). All randomness comes from ``rng``, so a
seed replays the same campaign.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import Producer

from tests.harness.proxy import Api
from tests.harness.transforms import HANG

if TYPE_CHECKING:
    from tests.chaos.campaign import World


@dataclass(order=True)
class Later:
    """Something to do at ``at`` (time.monotonic()): a fault's own healing."""

    at: float
    what: str = field(compare=False)
    action: Callable[[], object] = field(compare=False)


Fault = Callable[["World", random.Random], str | None]


# ----------------------------------------------------------------------------- replicas


def replica_sigkill(world: World, rng: random.Random) -> str | None:
    replica = world.pick_replica(rng)
    if replica is None:
        return None
    world.expect_exit(replica, -signal.SIGKILL)
    replica.kill()
    delay = rng.uniform(1, 4)
    world.later(delay, f"restart {replica.name}", lambda: world.restart(replica))
    return f"SIGKILL replica {replica.name}; restarted in {delay:.1f} s"


def replica_sigterm(world: World, rng: random.Random) -> str | None:
    replica = world.pick_replica(rng)
    if replica is None:
        return None
    world.expect_exit(replica, 0)
    replica.signal(signal.SIGTERM)
    delay = rng.uniform(2, 5)
    world.later(delay, f"restart {replica.name}", lambda: world.restart(replica))
    return f"SIGTERM replica {replica.name}; restarted in {delay:.1f} s"


def replica_pause(world: World, rng: random.Random) -> str | None:
    """SIGSTOP past the session time-out (its partitions move), then SIGCONT: a zombie
    that wakes up must be fenced, not commit."""
    replica = world.pick_replica(rng)
    if replica is None:
        return None
    seconds = world.session_timeout_s + rng.uniform(1, 4)
    replica.signal(signal.SIGSTOP)
    world.paused_replicas.add(replica.name)

    def resume() -> None:
        world.paused_replicas.discard(replica.name)
        if replica.alive():
            replica.signal(signal.SIGCONT)
    world.later(seconds, f"SIGCONT {replica.name}", resume)
    return f"SIGSTOP replica {replica.name} for {seconds:.1f} s"


def replica_scale(world: World, rng: random.Random) -> str | None:
    """One replica more (a scale-up), or, when one was added, one fewer (SIGTERM)."""
    extra = [r for r in world.live_replicas() if r.name in world.extras
             and r.proc is not None and r.proc.pid not in world.expected_exits]
    if extra:
        replica = rng.choice(extra)
        world.expect_exit(replica, 0)
        world.extras.discard(replica.name)
        world.left.add(replica.name)
        replica.signal(signal.SIGTERM)
        return f"replica {replica.name} leaves (SIGTERM)"
    replica = world.add_replica()
    return f"replica {replica.name} joins"


# ----------------------------------------------------------------------------- brokers


def broker_kill(world: World, rng: random.Random) -> str | None:
    cluster = world.cluster
    running = [i for i in cluster.node_ids if cluster.is_running(i) and not cluster.is_paused(i)]
    if len(running) < cluster.size:  # one fault at a time per cluster: keep a quorum
        return None
    node = rng.choice(running)
    cluster.kill(node)
    delay = rng.uniform(2, 6)
    world.later(delay, f"restart broker {node}", lambda: cluster.restart(node))
    return f"SIGKILL broker {node}; restarted in {delay:.1f} s"


def broker_pause(world: World, rng: random.Random) -> str | None:
    cluster = world.cluster
    running = [i for i in cluster.node_ids if cluster.is_running(i) and not cluster.is_paused(i)]
    if len(running) < cluster.size:
        return None
    node = rng.choice(running)
    seconds = rng.uniform(2, 6)
    cluster.pause(node)
    world.later(seconds, f"resume broker {node}", lambda: cluster.resume(node))
    return f"SIGSTOP broker {node} for {seconds:.1f} s"


# ----------------------------------------------------------------------------- network


def net_end_txn_late(world: World, rng: random.Random) -> str | None:
    """EndTxn answers held back: commits and aborts wait, time out, are retried."""
    seconds, during = rng.uniform(1, 5), rng.uniform(5, 12)
    world.proxy.delay_response(Api.END_TXN, seconds, duration_s=during)
    return f"EndTxn responses {seconds:.1f} s late for {during:.0f} s"


def net_produce_dropped(world: World, rng: random.Random) -> str | None:
    """The connection dies after the broker wrote a Produce but before the answer."""
    count = rng.randint(1, 4)
    world.proxy.drop_connection(Api.PRODUCE, on="response", count=count, duration_s=20)
    return f"{count} connection(s) dropped after a Produce was written"


def net_offsets_late(world: World, rng: random.Random) -> str | None:
    seconds, during = rng.uniform(1, 4), rng.uniform(5, 10)
    world.proxy.delay_request((Api.ADD_OFFSETS_TO_TXN, Api.TXN_OFFSET_COMMIT), seconds,
                              duration_s=during)
    return f"AddOffsetsToTxn/TxnOffsetCommit {seconds:.1f} s late for {during:.0f} s"


def net_partition_replica(world: World, rng: random.Random) -> str | None:
    """Every connection of one replica held (a network partition), then released."""
    replica = world.pick_replica(rng)
    if replica is None or replica.proc is None:
        return None
    seconds = rng.uniform(2, world.session_timeout_s + 3)
    world.proxy.blackhole(seconds, client_id=f"txstage-*-{replica.proc.pid}")
    return f"replica {replica.name} cut off from the brokers for {seconds:.1f} s"


# ----------------------------------------------------------------------------- transform


def transform_stall(world: World, rng: random.Random) -> str | None:
    """One record's transform stalls past transaction.timeout.ms or past
    max.poll.interval.ms (whichever is drawn)."""
    if Path(world.stall_file).exists():
        return None
    past, limit = rng.choice([("transaction.timeout.ms", world.transaction_timeout_s),
                              ("max.poll.interval.ms", world.max_poll_interval_s)])
    seconds = limit + rng.uniform(1, 3)
    Path(world.stall_file).write_text(f"{seconds:.1f}")
    return f"a transform call stalls {seconds:.1f} s (past {past})"


def transform_slow_phase(world: World, rng: random.Random) -> str | None:
    """Every replica's transform takes 50-200 ms a record for 20 s (a slow enrichment
    service): transactions, stops and heartbeats must stay bounded by the clock."""
    slow = world.log_dir / "slow"
    if slow.exists() and float(slow.read_text().split()[1]) > time.time():
        return None
    ms = rng.uniform(50, 200)
    slow.write_text(f"{ms:.0f} {time.time() + 20:.3f}")
    return f"the transform takes {ms:.0f} ms a record for 20 s"


def poison_near_limit(world: World, rng: random.Random) -> str | None:
    """A record just under the topics' max.message.bytes (the default, 1,048,588) that
    the transform rejects: its dead letter (value + error headers) must be cut to fit
    the dead-letter topic, never refused."""
    size = rng.randint(1_048_000, 1_048_400)
    producer = Producer({"bootstrap.servers": world.cluster.direct_bootstrap,
                         "enable.idempotence": True, "message.max.bytes": 1_048_588})
    producer.produce(world.env["TXSTAGE_INPUT_TOPICS"], b"x" * size, b"near-limit")
    if producer.flush(30) != 0:
        return None
    return f"a {size:,}-byte poison record"


def large_record_lag(world: World, rng: random.Random) -> str | None:
    """A burst of ~40 KB records while every replica's transform takes 20 ms a record
    for 15 s: partitions lag with large records, so what they hold is bounded by bytes
    (TXSTAGE_HELD_*), not by count. Values are a number padded with spaces, which the
    transform squares like any other."""
    count = rng.randint(500, 1500)
    slow = world.log_dir / "slow"
    slow.write_text(f"20 {time.time() + 15:.3f}")
    producer = Producer({"bootstrap.servers": world.cluster.direct_bootstrap,
                         "enable.idempotence": True, "linger.ms": 20})
    pad = b" " * 40_000
    for i in range(count):
        while True:
            try:
                producer.produce(world.env["TXSTAGE_INPUT_TOPICS"], b"%d" % i + pad,
                                 b"big-%d" % (i % 64))
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60) != 0:
        return None
    return f"{count} records of 40 KB while the transform takes 20 ms a record for 15 s"


def transform_hang(world: World, rng: random.Random) -> str | None:
    """A record whose transform never returns: in-process each replica that reaches it
    exits 5 after TXSTAGE_TRANSFORM_TIMEOUT_MS (restarted, as an orchestrator would);
    with workers its worker is killed. After the attempts it is dead-lettered."""
    producer = Producer({"bootstrap.servers": world.cluster.direct_bootstrap,
                         "enable.idempotence": True})
    producer.produce(world.env["TXSTAGE_INPUT_TOPICS"], HANG, b"hang")
    if producer.flush(30) != 0:
        return None
    return "a record whose transform never returns"


def worker_kill(world: World, rng: random.Random) -> str | None:
    """SIGKILL one transform worker process of a replica (TXSTAGE_WORKERS only)."""
    replica = world.pick_replica(rng) if world.env.get("TXSTAGE_WORKERS") else None
    if replica is None or replica.proc is None:
        return None
    workers = worker_pids(replica.proc.pid)
    if not workers:
        return None
    victim = rng.choice(workers)
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim, signal.SIGKILL)
    return f"SIGKILL worker {victim} of replica {replica.name}"


def worker_pids(pid: int) -> list[int]:
    """A replica's transform worker processes (children started by multiprocessing)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [int(child) for child in children
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]
    except OSError:
        return []


WORKERS_ONLY = {"worker_kill"}  # drawn only in a campaign with TXSTAGE_WORKERS

LIBRARY: dict[str, Fault] = {
    "replica_sigkill": replica_sigkill,
    "replica_sigterm": replica_sigterm,
    "replica_pause": replica_pause,
    "replica_scale": replica_scale,
    "broker_kill": broker_kill,
    "broker_pause": broker_pause,
    "net_end_txn_late": net_end_txn_late,
    "net_produce_dropped": net_produce_dropped,
    "net_offsets_late": net_offsets_late,
    "net_partition_replica": net_partition_replica,
    "transform_stall": transform_stall,
    "transform_slow_phase": transform_slow_phase,
    "poison_near_limit": poison_near_limit,
    "large_record_lag": large_record_lag,
    "transform_hang": transform_hang,
    "worker_kill": worker_kill,
}


def now() -> float:
    return time.monotonic()
