"""The loop's Python cost per record, in-process and without a broker.

``python -m bench.hotpath [--records N] [--repeat R]``

Feeds synthetic consumed messages (1 KB values, one input partition per 500-record
batch, as a fetch delivers them) to:

- ``stage_eos``: ``InProcess.process`` (the runner) with the exactly-once committer; its pinned
  producer's client is a plain producer pointed at a closed port, so ``produce()``
  only queues (no transaction, no network);
- ``stage_alo``: the same with the at-least-once committer (its delivery reports
  never come: no broker);
- ``bare``: ``bench.bare.process`` over the same messages and the same kind of
  producer.

It prints µs per record (median of ``--repeat`` runs) and stage ÷ bare. It measures
only the Python work of the loop thread — what the stage adds per record — not
throughput: ``bench.throughput`` is the benchmark of record. Use it to see the effect
of a hot-path change in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import cast

from confluent_kafka import Consumer, Message, Producer
from prometheus_client import CollectorRegistry

from bench.bare import process as bare_process
from bench.transforms import identity
from service.kafka.cluster import Cluster, OutputLimits
from service.kafka.producer import PinnedProducer
from service.observability import interpreter
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import load_settings
from service.stage import machine as sm
from service.stage.guarantees.at_least_once import AtLeastOnce
from service.stage.guarantees.exactly_once import ExactlyOnce
from service.stage.guarantees.guarantee import Guarantee
from service.stage.in_process import InProcess
from service.stage.loop import Loop
from service.stage.partition import Partition

BATCH = 500
PARTITIONS = 8
NOWHERE = "127.0.0.1:1"


def _client() -> Producer:
    return Producer({"bootstrap.servers": NOWHERE, "log_level": 0,
                     "queue.buffering.max.messages": 2_000_000,
                     "queue.buffering.max.kbytes": 8_000_000,
                     "message.timeout.ms": 600_000})


def _batches(records: int) -> list[list[Message]]:
    value = b"x" * 1024
    batches, per_partition = [], records // PARTITIONS
    for start in range(0, per_partition, BATCH):
        for partition in range(PARTITIONS):
            batches.append([Message(topic="in", partition=partition, offset=offset,
                                    key=str(offset).encode(), value=value,
                                    timestamp=(1, 1_700_000_000_000))
                            for offset in range(start, min(start + BATCH, per_partition))])
    return batches


class _Limits(OutputLimits):
    def __init__(self) -> None:
        super().__init__(cast(Cluster, None), 1_000_000, blocking=False)
        self._known["out"] = 1_000_000


def _loop(guarantee: str) -> Loop:
    settings = load_settings({
        "TXSTAGE_BOOTSTRAP_SERVERS": NOWHERE, "TXSTAGE_GROUP_ID": "hotpath",
        "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
        "TXSTAGE_TRANSFORM": "bench.transforms:identity", "TXSTAGE_GUARANTEE": guarantee})
    metrics = Metrics(CollectorRegistry())
    committer: Guarantee
    if guarantee == "exactly_once":
        eos = ExactlyOnce(settings, metrics)
        for number in range(PARTITIONS):
            pinned = PinnedProducer({"bootstrap.servers": NOWHERE, "transactional.id": "x",
                                     "log_level": 0}, "in", number, deadline_s=1)
            pinned._producer = _client()  # queue only: measure the stage, not a broker
            pinned.in_transaction = True
            eos._producers[("in", number)] = pinned
        committer = eos
    else:
        alo = AtLeastOnce(settings, metrics, lambda offsets, asynchronous: None)
        alo._producer = _client()
        committer = alo
    consumer = Consumer({"bootstrap.servers": NOWHERE, "group.id": "hotpath",
                         "log_level": 0})
    loop = Loop(settings, identity, metrics, Health(), _Limits(), consumer, committer,
                sm.Policy(commit_interval_s=3600, commit_max_records=10**9))
    for number in range(PARTITIONS):
        partition = Partition("in", number)
        state, _ = sm.assigned()
        state, _ = sm.transition(state, sm.InitDone(0.0), loop.policy)
        state, _ = sm.transition(state, sm.Positioned(0, 0.0), loop.policy)
        partition.state, partition.position = state, 0
        loop.partitions[partition.key] = partition
    return loop


def _process(loop: Loop) -> Callable[[list[Message]], object]:
    """As ``Loop.iterate`` calls it: with the monotonic clock's now (the loop compares
    it with the clock between records)."""
    runner = cast(InProcess, loop.runner)
    return lambda batch: runner.process(batch, time.monotonic())


def _bare(producer: Producer) -> Callable[[list[Message]], object]:
    return lambda batch: bare_process(batch, identity, producer, "out")


def _timed(run: Callable[[list[Message]], object], batches: list[list[Message]]) -> float:
    records = sum(len(b) for b in batches)
    started = time.perf_counter()
    for batch in batches:
        run(batch)
    return (time.perf_counter() - started) / records * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=80_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    batches = _batches(args.records)
    interpreter.tune_gc()  # as `txstage run` does once start-up is done
    results: dict[str, list[float]] = {"stage_eos": [], "stage_alo": [], "bare": []}
    for _ in range(args.repeat):
        for guarantee, name in (("exactly_once", "stage_eos"), ("at_least_once", "stage_alo")):
            results[name].append(_timed(_process(_loop(guarantee)), batches))
        results["bare"].append(_timed(_bare(_client()), batches))
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, value in medians.items():
        print(f"{name:10} {value:6.2f} µs/record")
    for name in ("stage_eos", "stage_alo"):
        print(f"{name} ÷ bare (time per record) {medians[name] / medians['bare']:.2f}")


if __name__ == "__main__":
    main()
