"""The driver: check the job, fix its plan, show it, run it on Spark, report it.

Everything that can be wrong with the arguments or the cluster (unloadable transform,
missing topics, impossible ranges, a job id reused with other arguments) is found here
before any record is written, and raised as ConfigError (exit code 2).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.backfill import (
    kafka_clients,
    offsets,
    plan_store,
    progress,
    report,
    rows,
    slice_reader,
    sources,
    tasks,
)
from service.backfill.config import JobConfig
from service.backfill.plan import Plan, Slice, fingerprint, slice_ranges
from service.backfill.progress import JobState
from service.backfill.report import Outcome
from service.backfill.session import spark_session
from service.backfill.specs import FileSource, KafkaSource, ParquetSink
from service.backfill.topic_map import missing_problem, unmapped_problem
from service.contract.processing import process
from service.contract.records import Record
from service.errors import ConfigError, PoisonRecordError
from service.formats.load import load_formatted

log = logging.getLogger("txstage.backfill")


@dataclass(slots=True)
class Run:
    """One invocation: its configuration, the settled plan and what was committed before."""

    config: JobConfig
    plan: Plan
    state: JobState | None  # Kafka sink only: the stored plan and slice progress
    started: float

    def pending(self) -> list[Slice]:
        state = self.state
        if state is None:
            return list(self.plan.slices)
        return [s for s in self.plan.slices
                if not (state.slices.get(s.index) and state.slices[s.index].done)]


def run(config: JobConfig) -> int:
    """The job, printed: exit code 0 (failures raise)."""
    report.print_summary(config, execute(config))
    return 0


def execute(config: JobConfig) -> Outcome:
    started = time.monotonic()
    load_formatted(config.transform, config.settings)  # unloadable → ConfigError first
    if isinstance(config.source, KafkaSource):
        return _from_kafka(config, config.source, started)
    return _from_files(config, config.source, started)


def _from_kafka(config: JobConfig, source: KafkaSource, started: float) -> Outcome:
    admin = kafka_clients.admin(config.kafka())
    ranges = _gathered(lambda: offsets.resolve(admin, source),
                       lambda: _check_sink_topics(config, admin))[0]
    fresh = _plan(config, slice_ranges(ranges, config.flags.slice_records))
    job = _settle(config, admin, fresh, started)
    seen = _sampled_topics(config, admin, _kafka_samples(config, job))
    early = _finished_before_spark(job, seen, admin)
    if early is not None:
        return early
    with _session(config) as spark:
        pending = sources.slice_indexes(spark, job.pending())
        reads = tasks.KafkaInput(config.kafka(), {s.index: s for s in job.plan.slices})
        if isinstance(config.sink, ParquetSink):
            return _to_parquet(spark, job, config.sink, functools.partial(
                tasks.read_to_rows, reads), pending)
        return _to_kafka(spark, job, functools.partial(tasks.read_kafka_slices, reads),
                         pending)


def _from_files(config: JobConfig, source: FileSource, started: float) -> Outcome:
    admin = kafka_clients.admin(config.kafka()) if config.kafka_sink else None
    if admin is not None:
        _check_sink_topics(config, admin)
    with _session(config) as spark:
        frame = sources.files(spark, source)
        fresh = _plan(config, slice_ranges(sources.file_ranges(frame, config.flags.slice_records),
                                           config.flags.slice_records))
        job = _settle(config, admin, fresh, started)
        sample = (record for _, record in rows.sliced_records(
            frame.limit(SAMPLE_RECORDS).select(F.lit(0).alias("slice"), "*").toArrow()
            .to_batches()))
        seen = _sampled_topics(config, admin, sample)
        early = _finished_before_spark(job, seen, admin)
        if early is not None:
            return early
        tagged = sources.tag_slices(spark, frame, job.pending(), config.flags.slice_records)
        if isinstance(config.sink, ParquetSink):
            return _to_parquet(spark, job, config.sink, tasks.transform_to_rows, tagged)
        return _to_kafka(spark, job, tasks.write_kafka_slices, tagged)


def _gathered(*checks: Callable[[], Any]) -> list[Any]:
    """Run every check; raise one ConfigError naming all their problems, if any."""
    results: list[Any] = []
    problems: list[str] = []
    for check in checks:
        try:
            results.append(check())
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(*problems)
    return results


def _session(config: JobConfig) -> AbstractContextManager[SparkSession]:
    return spark_session(f"txstage-backfill-{config.job_id}", master=config.flags.master,
                         conf=config.flags.spark_conf,
                         kafka_sink=config.kafka_sink)


def _plan(config: JobConfig, slices: tuple[Slice, ...]) -> Plan:
    return Plan(config.job_id, fingerprint(config.definition), config.flags.slice_records,
                slices)


# -- the topics the transform writes: a sample, checked before anything is written ------

SAMPLE_RECORDS = 100  # per slice (a file source: of the whole input)
SAMPLED_SLICES = 64   # at most, spread over the plan: the driver reads them one by one


def _kafka_samples(config: JobConfig, job: Run) -> Iterator[Record]:
    """The first records of each pending slice (of at most SAMPLED_SLICES, spread)."""
    pending = job.pending()
    step = max(1, -(-len(pending) // SAMPLED_SLICES))
    for piece in pending[::step]:
        yield from slice_reader.read_range(config.kafka(), piece.topic, piece.partition,
                                           piece.start, min(piece.end,
                                                            piece.start + SAMPLE_RECORDS))


def _sampled_topics(config: JobConfig, admin: AdminClient | None,
                    sample: Iterable[Record]) -> dict[str, str]:
    """``topic -> the input that first wrote to it`` over ``sample``, the transform run as
    the tasks run it."""
    transform = load_formatted(config.transform, config.settings,
                               config.topics.live(config.output_topic))
    run = functools.partial(process, transform,
                            default_topic=config.output_topic, dlq_topic=config.dlq_topic,
                            max_bytes=lambda _topic: tasks.UNLIMITED)
    seen: dict[str, str] = {}
    for record in sample:
        try:
            result = run(record)
        except PoisonRecordError:
            continue
        for out in result.outputs:
            seen.setdefault(out.topic, f"{record.topic}/{record.partition}/{record.offset}")
    return seen


def _missing_sinks(config: JobConfig, admin: AdminClient | None,
                   seen: dict[str, str]) -> set[str]:
    """The topics of ``seen`` whose sink topic does not exist (a Kafka sink's; those
    named up front were checked before planning)."""
    if not config.kafka_sink:
        return set()
    assert admin is not None, "a Kafka sink has an admin client"
    topics = config.topics
    return {topic for topic in seen if topics.maps(topic)
            and topics(topic) not in topics.targets()
            and offsets.topic_partitions(admin, topics(topic)) is None}


def _topic_problems(config: JobConfig, seen: dict[str, str], missing: set[str]) -> list[str]:
    """A Kafka sink refuses a topic it does not map, and one whose sink topic does not
    exist: an output the whole sample makes would be dead-lettered for most of a topic,
    a misconfiguration to fix before anything is written (docs/decisions.md)."""
    if not config.kafka_sink:
        return []
    topics = config.topics
    return [unmapped_problem(topic, where) if not topics.maps(topic) else
            missing_problem(topic, topics(topic), where, topics.rule(topic))
            for topic, where in sorted(seen.items())
            if not topics.maps(topic) or topic in missing]


def _finished_before_spark(job: Run, seen: dict[str, str],
                           admin: AdminClient | None) -> Outcome | None:
    """Print the plan; the outcome when there is nothing for Spark to do (a dry run, or
    every slice done), else None. A topic problem of the sample is refused (exit 2)
    before the plan is printed, or after it in a dry run, which says the same as the run
    would."""
    missing = _missing_sinks(job.config, admin, seen)
    problems = _topic_problems(job.config, seen, missing)
    if problems and not job.config.flags.dry_run:
        raise ConfigError(*problems)
    report.print_plan(job.config, job.plan, job.state, seen, missing)
    if problems:
        raise ConfigError(*problems)
    if job.config.flags.dry_run:
        return _outcome(job, job.state, [], 0.0, "dry run")
    if not job.pending():
        return _outcome(job, job.state, [], 0.0, "already complete")
    return None


def _outcome(job: Run, state: JobState | None, summaries: Sequence[dict[str, int]],
             spark_seconds: float, status: str = "complete") -> Outcome:
    inputs, outputs, dead = report.totals(state) if state else (0, 0, 0)
    return Outcome(job.config.job_id, inputs, outputs, dead,
                   sum(row["records"] for row in summaries),
                   sum(row["transactions"] for row in summaries),
                   sum(row["aborts"] for row in summaries),
                   time.monotonic() - job.started, spark_seconds, status)


# -- checks and the stored plan ----------------------------------------------------------


def _check_sink_topics(config: JobConfig, admin: AdminClient) -> None:
    """A Kafka sink's output and dead-letter topics must exist. (The progress topic may
    have any number of partitions: its records are all produced to, and read from,
    partition 0.)"""
    if not config.kafka_sink:
        return
    problems = []
    for what, topic in (("output", config.output_topic), ("dead-letter", config.dlq_topic)):
        if topic and offsets.topic_partitions(admin, topic) is None:
            problems.append(f"{what} topic {topic!r} does not exist: create it "
                            f"(txstage topics create --topic {topic})")
    for topic, sink in sorted(config.topics.named.items()):
        if sink not in (config.output_topic, config.dlq_topic) and \
                offsets.topic_partitions(admin, sink) is None:
            problems.append(f"sink topic {sink!r} (--topic-map {topic}={sink}) does not "
                            f"exist: create it (txstage topics create --topic {sink})")
    if problems:
        raise ConfigError(*problems)


def _settle(config: JobConfig, admin: AdminClient | None, fresh: Plan, started: float) -> Run:
    """The plan to run: for a Kafka sink, the one stored under the job id if there is one
    (so re-running resumes the same slices), else the fresh one, stored now (once, if
    drivers race: see plan_store)."""
    if not config.kafka_sink:
        return Run(config, fresh, None, started)
    assert admin is not None, "a Kafka sink has an admin client"
    settings, topic = config.kafka(), config.progress_topic
    if config.flags.dry_run:  # stores nothing
        exists = offsets.topic_partitions(admin, topic) is not None
        state = kafka_clients.read_job(settings, topic, config.job_id) if exists else JobState()
        if state.plan is None:
            return Run(config, fresh, state, started)
    else:
        progress.ensure_topic(admin, topic)
        state, stored = plan_store.settle(settings, topic, config.id_prefix, fresh,
                                          config.definition)
        if stored:
            return Run(config, fresh, state, started)
    assert state.plan is not None
    _check_same_job(config, state, fresh)
    return Run(config, state.plan, state, started)


def _check_same_job(config: JobConfig, state: JobState, fresh: Plan) -> None:
    assert state.plan is not None
    changed = sorted(k for k in {*config.definition, *state.definition}
                     if config.definition.get(k) != state.definition.get(k))
    if changed:
        was = ", ".join(f"{k}={state.definition.get(k)!r}" for k in changed)
        raise ConfigError(f"job {config.job_id} was started with {was}; it cannot change: "
                          f"re-run with those arguments to resume, or use a new --job-id")
    if isinstance(config.source, FileSource) and state.plan.slices != fresh.slices:
        raise ConfigError(f"the input files changed since job {config.job_id} was planned "
                          f"({len(state.plan.slices)} slices then, {len(fresh.slices)} now): "
                          f"use a new --job-id")
    if state.plan.slices != fresh.slices:
        log.info("job %s keeps the range it planned on its first run; the topic has changed "
                 "since (use a new --job-id to include new records)", config.job_id)


# -- running -----------------------------------------------------------------------------


def _processing(config: JobConfig, *, kafka_limits: bool) -> tasks.Processing:
    settings = config.settings
    return tasks.Processing(config.transform, config.output_topic, config.dlq_topic,
                            tasks.max_bytes(settings, kafka_sink=kafka_limits),
                            settings if kafka_limits else None,
                            config.topics)


# The mapInArrow bodies: (what they need, the task's input batches) → output batches.
SinkTask = Callable[[tasks.KafkaSinkJob, Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]
RowsTask = Callable[[tasks.Processing, tasks.Counters, Iterable[pa.RecordBatch]],
                    Iterator[pa.RecordBatch]]


def _to_kafka(spark: SparkSession, job: Run, body: SinkTask, frame: DataFrame) -> Outcome:
    config = job.config
    sink = tasks.KafkaSinkJob(
        _processing(config, kafka_limits=True), config.kafka(), config.job_id, config.id_prefix,
        config.progress_topic, config.flags.transaction_records, config.flags.transaction_ms,
        config.flags.transaction_bytes, {s.index: s for s in job.plan.slices})
    began = time.monotonic()
    with report.Reporter(spark, job.plan, config, job.state):
        rows_ = frame.mapInArrow(functools.partial(body, sink), rows.SUMMARY_DDL).collect()
    summaries: list[dict[str, int]] = [row.asDict() for row in rows_]
    _close_empty_slices(sink, job.pending(), summaries)
    spark_seconds = time.monotonic() - began
    final = kafka_clients.read_job(config.kafka(), config.progress_topic, config.job_id)
    unfinished = [s.index for s in job.plan.slices
                  if not (final.slices.get(s.index) and final.slices[s.index].done)]
    if unfinished:
        raise RuntimeError(f"slices {unfinished} of job {config.job_id} did not finish")
    return _outcome(job, final, summaries, spark_seconds)


def _close_empty_slices(sink: tasks.KafkaSinkJob, pending: Sequence[Slice],
                        summaries: list[dict[str, int]]) -> None:
    """A slice with no committed record left to read (all aborted, or already written)
    never reached a task: mark it done here, through its own producer, like a task would."""
    reported = {row["slice"] for row in summaries}
    for piece in pending:
        if piece.index not in reported:
            outcome = tasks.write_slice(sink, piece.index, lambda _start: ())
            summaries.append(tasks.summary(piece.index, outcome))


def _to_parquet(spark: SparkSession, job: Run, sink: ParquetSink, body: RowsTask,
                frame: DataFrame) -> Outcome:
    config = job.config
    if not config.flags.overwrite and _path_exists(spark, sink.path):
        raise ConfigError(f"sink {sink}: the path exists; pass --overwrite to replace it")
    counters = tasks.Counters(spark.sparkContext)
    processing = _processing(config, kafka_limits=False)
    outputs = frame.mapInArrow(functools.partial(body, processing, counters), rows.OUTPUT_DDL)
    began = time.monotonic()
    with report.Reporter(spark, job.plan, config, None):
        outputs.write.mode("overwrite" if config.flags.overwrite else "errorifexists") \
            .parquet(sink.path)
    inputs, produced, dead = counters.values()
    return Outcome(config.job_id, inputs, produced, dead, inputs, seconds=time.monotonic()
                   - job.started, spark_seconds=time.monotonic() - began)


def _path_exists(spark: SparkSession, path: str) -> bool:
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a started session has a JVM"
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    filesystem = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(filesystem.exists(hadoop_path))
