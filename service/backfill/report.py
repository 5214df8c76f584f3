"""What the operator sees: the plan (also the dry run), progress in the log, the summary.

The plan and the summary go to stdout; progress lines go to the ``txstage.backfill``
logger every ``--progress-interval`` seconds, from the committed slice progress in Kafka
(Kafka sink) and Spark's task counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from service.backfill import kafka_clients, progress
from service.backfill.config import JobConfig
from service.backfill.plan import Plan, Slice
from service.backfill.progress import JobState
from service.backfill.specs import KafkaSink, KafkaSource

log = logging.getLogger("txstage.backfill")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a job did, for the summary (and the benchmark)."""

    job_id: str
    inputs: int  # committed inputs of the whole job (every run, for a Kafka sink)
    outputs: int
    dead_lettered: int
    inputs_this_run: int
    transactions: int = 0
    aborts: int = 0
    seconds: float = 0.0  # this invocation, start to end
    spark_seconds: float = 0.0  # the Spark job that transformed and wrote
    status: str = "complete"  # complete | already complete | dry run


def _out(line: str = "") -> None:
    print(line, flush=True)


def plan_lines(config: JobConfig, plan: Plan, state: JobState | None) -> list[str]:
    done = _done(plan, state)
    status = ("new" if state is None or state.plan is None
              else f"resuming: {len(done)} of {len(plan.slices)} slices done")
    exact = all(s.records is not None for s in plan.slices)
    lines = [
        f"backfill job {config.job_id} ({status}{', dry run' if config.flags.dry_run else ''})",
        f"  source     {config.source}"
        + (" (read_committed)" if isinstance(config.source, KafkaSource) else ""),
        f"  sink       {_sink(config)}",
        f"  transform  {config.transform} (dead letters: {config.dlq_topic or 'none: fail'})",
        f"  {'slice':>5}  {'input':<28} {'offsets':<23} {'records':>10}  progress",
    ]
    lines += [_slice_line(s, state) for s in plan.slices]
    bound = "" if exact else "at most "
    lines.append(f"  total: {len(plan.slices)} slices, {bound}{plan.max_records} input records")
    return lines


def _sink(config: JobConfig) -> str:
    if isinstance(config.sink, KafkaSink):
        mapped = "".join(f", {topic} -> {sink}" for topic, sink in
                         sorted(config.topics.named.items()))
        suffix = f", any other topic -> <topic>{config.topics.suffix}" \
            if config.topics.suffix else ", no other topic"
        return (f"kafka, exactly once: default outputs to {config.output_topic}{mapped}"
                f"{suffix}; progress in {config.progress_topic}, transactional ids "
                f"{config.id_prefix}.backfill.{config.job_id}.<slice>")
    return f"{config.sink} (default topic column: {config.output_topic})"


def _slice_line(piece: Slice, state: JobState | None) -> str:
    records = f"≤{piece.span}" if piece.records is None else str(piece.records)
    found = state.slices.get(piece.index) if state else None
    if found is None:
        where = "new"
    elif found.done:
        where = f"done ({found.records_in} in, {found.outputs} out)"
    else:
        where = f"at offset {found.next_offset} ({found.records_in} in)"
    span = f"{piece.start}..{piece.end}"
    return (f"  {piece.index:>5}  {piece.topic + '/' + str(piece.partition):<28} {span:<23} "
            f"{records:>10}  {where}")


def _done(plan: Plan, state: JobState | None) -> list[int]:
    if state is None:
        return []
    return [s.index for s in plan.slices
            if (p := state.slices.get(s.index)) is not None and p.done]


def print_plan(config: JobConfig, plan: Plan, state: JobState | None,
               seen: Mapping[str, str] | None = None,
               missing: Collection[str] = ()) -> None:
    for line in plan_lines(config, plan, state):
        _out(line)
    if seen is not None:
        for line in topic_lines(config, seen, missing):
            _out(line)


def topic_lines(config: JobConfig, seen: Mapping[str, str],
                missing: Collection[str] = ()) -> list[str]:
    """The topics the transform wrote in the sample, and where each one goes (``missing``:
    those whose sink topic does not exist)."""
    lines = [f"  topics written by a sample of each slice ({len(seen)}):"]
    for topic, where in sorted(seen.items()):
        how = config.topics.how(topic) + (", DOES NOT EXIST" if topic in missing else "")
        lines.append(f"    {topic:<28} {how:<40} first from {where}")
    return lines


def totals(state: JobState) -> tuple[int, int, int]:
    """Committed inputs, outputs and dead letters over every slice of a job."""
    found = list(state.slices.values())
    return (sum(p.records_in for p in found), sum(p.outputs for p in found),
            sum(p.dead_lettered for p in found))


def print_summary(config: JobConfig, outcome: Outcome) -> None:
    if outcome.status == "dry run":
        _out(f"backfill job {config.job_id}: dry run, nothing written")
        return
    if outcome.status == "already complete":
        _out(f"backfill job {config.job_id} was already complete: nothing written")
    else:
        _out(f"backfill job {config.job_id} complete: {config.sink}")
    earlier = outcome.inputs - outcome.inputs_this_run
    _out(f"  inputs          {outcome.inputs} ({outcome.inputs_this_run} this run, "
         f"{earlier} by earlier runs)")
    _out(f"  outputs         {outcome.outputs}")
    _out(f"  dead-lettered   {outcome.dead_lettered}")
    if isinstance(config.sink, KafkaSink):
        _out(f"  transactions    {outcome.transactions} this run, "
             f"{outcome.aborts} aborted and replayed")
    _out(f"  time            {outcome.seconds:.1f} s; Spark job {outcome.spark_seconds:.1f} s, "
         f"{_rate(outcome.inputs_this_run, outcome.spark_seconds)} inputs/s")


def _rate(records: int, seconds: float) -> str:
    return f"{records / seconds:,.0f}" if seconds > 0 else "-"


class Reporter:
    """A daemon thread that logs progress until the Spark job ends (a context manager)."""

    def __init__(self, spark: Any, plan: Plan, config: JobConfig,
                 state: JobState | None) -> None:
        self.spark, self.plan, self.config = spark, plan, config
        self.interval = config.flags.progress_interval_s
        self.state = JobState(plan, dict(config.definition), 0,
                              dict(state.slices) if state else {})
        self.before = totals(self.state)[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="backfill-progress",
                                        daemon=True)
        self._consumer: Any = None
        self._began = time.monotonic()

    def __enter__(self) -> Reporter:
        if self.interval > 0:
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _loop(self) -> None:
        if isinstance(self.config.sink, KafkaSink):
            self._consumer = kafka_clients.progress_consumer(self.config.kafka())
            self._consumer.assign([TopicPartition(self.config.progress_topic,
                                                  progress.PARTITION, OFFSET_BEGINNING)])
        try:
            while not self._stop.wait(self.interval):
                self._report()
        except Exception as exc:  # progress lines are a courtesy: never fail the job
            log.warning("progress reporting stopped: %s", exc)
        finally:
            if self._consumer is not None:
                self._consumer.close()

    def _report(self) -> None:
        tasks = self._tasks()
        if self._consumer is None:
            log.info("backfill %s: %s", self.config.job_id, tasks)
            return
        self._fold()
        inputs, outputs, dead = totals(self.state)
        done = len(_done(self.plan, self.state))
        rate = _rate(inputs - self.before, time.monotonic() - self._began)
        log.info("backfill %s: %d/%d slices done, %d of %s%d inputs committed (%s/s), "
                 "%d outputs, %d dead-lettered; %s", self.config.job_id, done,
                 len(self.plan.slices), inputs,
                 "" if all(s.records is not None for s in self.plan.slices) else "≤",
                 self.plan.max_records, rate, outputs, dead, tasks)

    def _fold(self) -> None:
        while True:
            messages = self._consumer.consume(1000, timeout=0.1)
            if not messages:
                return
            for message in messages:
                if message.error() is None:
                    progress.apply(self.state, self.config.job_id, message.key(),
                                   message.value())
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    return

    def _tasks(self) -> str:
        tracker = self.spark.sparkContext.statusTracker()
        stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
        stages = [s for s in stages if s is not None]
        if not stages:
            return "no Spark stage running"
        return ", ".join(f"stage {s.stageId}: {s.numCompletedTasks}/{s.numTasks} tasks done, "
                         f"{s.numActiveTasks} running" for s in stages)

