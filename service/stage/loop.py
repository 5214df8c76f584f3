"""The consumer loop: consume a batch, turn records into outputs, and carry out what
the partitions' state machine decides. It decides nothing itself and never waits on
Kafka except in ``consume()``: commits, aborts, inits and lookups are jobs.

One iteration:
1. ``consume()`` a batch (rebalance callbacks run inside it);
2. settle: dispatch the events of finished jobs and of delivery reports;
3. run: the runner (stage/runner.py) turns the batch into results, partition by
   partition in offset order;
4. tick: start the commits that are due, end backoffs, reclaim fenced partitions.

A batch is a unit of fetching, not of time (docs/state-machine.md, "Time bounds
the work"): between records the runner looks at the clock, and a checkpoint starts
the commits that fell due, beats the liveness heartbeat and ends the batch when the
replica stops. Records of a committing partition are held, in order, meanwhile.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import replace

import structlog
from confluent_kafka import (
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)

from service.contract.records import Transform
from service.error_codes import DENIALS, LOOK_AGAIN
from service.errors import (
    DeniedError,
    FatalError,
    KafkaOperationError,
    Where,
)
from service.kafka.cluster import OutputLimits
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import Settings
from service.stage import machine as sm
from service.stage.fetch_watch import FetchWatch
from service.stage.guarantees.guarantee import Guarantee, group_metadata_of
from service.stage.guarantees.spanning import Spanning
from service.stage.housekeeping import Housekeeper
from service.stage.in_process import InProcess
from service.stage.jobs import Jobs
from service.stage.offload import OnWorkers
from service.stage.overruns import OverrunBook
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.positions import Positions
from service.stage.reports import Reporter
from service.stage.runner import Runner, tell_written
from service.stage.span import Span
from service.stage.topic_lookups import TopicLookups
from service.stage.transform_watch import Marker
from service.stage.workers import WorkerPool

log = structlog.get_logger(__name__)

_STARTUP_PHASES = (sm.Phase.INITIALISING, sm.Phase.POSITIONING)
# Calls stuck in librdkafka past every deadline (CallStuck) each keep a job thread:
# past this many the replica fails, so that its orchestrator starts a fresh process.
_MAX_STUCK_CALLS = 4
_BUSY_POLL_S = 0.005  # consume()'s wait while a commit runs or records are held


class Loop:
    """One replica's consumer loop over the partitions it owns. It carries out what
    the state machine decides with its parts, each an object of its own: the
    ``runner`` (records to results), ``positions`` (seeks), ``reporter`` (log lines
    and metrics), ``housekeeper`` (the once-a-second watch) and ``topics`` (output
    topic lookups)."""

    def __init__(self, settings: Settings, transform: Transform, metrics: Metrics,
                 health: Health, limits: OutputLimits, consumer: Consumer,
                 committer: Guarantee, policy: sm.Policy,
                 pool: WorkerPool | None = None) -> None:
        self.settings = settings
        self.transform = transform
        self.metrics = metrics
        self.health = health
        self.limits = limits
        self.consumer = consumer
        self.committer = committer
        self.policy = policy
        self.jobs = Jobs()
        self.partitions: dict[TopicPartitionKey, Partition] = {}
        self.recorded: list[BaseException] = []
        self.pool = pool  # TXSTAGE_WORKERS: the transform runs there (OnWorkers)
        metrics.commit_interval.set(policy.commit_interval_s)
        self.fetch_watch = FetchWatch(settings.fetch_stall_s)
        # A seek makes what the partition holds stale: the runner (built below) forgets it.
        self.positions = Positions(consumer, metrics, settings, self.partitions,
                                   lambda partition: self.runner.discard(partition),  # noqa: PLW0108
                                   self.fetch_watch.stall_after_s)
        self.topics = TopicLookups(self.jobs)
        self._group_metadata = group_metadata_of(consumer)
        self.polled_at = time.monotonic()  # when consume() last returned
        # Read at scrape time, so it grows while the loop is stuck between two polls.
        metrics.seconds_since_poll.set_function(lambda: time.monotonic() - self.polled_at)
        self.watch = Marker()
        # The committer as it is when a line is logged (a test may replace it).
        self.reporter = Reporter(metrics, health, self.partitions,
                                 lambda key: self.committer.transactional_id(key))  # noqa: PLW0108
        self.housekeeper = Housekeeper(settings, metrics, consumer, self.jobs, self.partitions,
                                       self.reporter, self.fetch_watch,
                                       policy.transaction_timeout_s)
        self.overruns: OverrunBook | None = None  # the Stage's (TXSTAGE_TRANSFORM_TIMEOUT_MS)
        parts = (self, settings, metrics, self.partitions, self.positions, self.reporter,
                 self.topics, self.watch)
        self.runner: Runner = InProcess(*parts) if pool is None else OnWorkers(*parts, pool)
        # TXSTAGE_TRANSACTIONS=spanning: partitions of one transaction move together.
        self.span = Span(committer, self.partitions, self.jobs, self.dispatch) if \
            isinstance(committer, Spanning) else None

    def iterate(self) -> None:
        self.health.beat()
        self.positions.next_batch()
        runner, wait_s = self.runner, self._poll_timeout_s()
        if self.span is not None and self.span.waited_for_commit(self.polled_at, runner):
            messages: list[Message] = []  # none consumed: each would only be held
            now = time.monotonic()
        else:  # results on their way from workers: Kafka is only looked at
            messages = self.consumer.consume(self.settings.batch_size,
                                             0 if runner.waiting() else wait_s)
            now = self.polled_at = time.monotonic()
            if len(messages) < self.settings.batch_size:
                self.fetch_watch.short_batches += 1  # librdkafka's queue ran dry
        runner.bound(now + self.policy.poll_gap_s)
        self.raise_recorded()
        self.settle(now)
        runner.run(messages, now, wait_s)
        self.tick(time.monotonic())

    def settle(self, now: float) -> None:
        """Dispatch what finished beside the loop: jobs, delivery reports, lookups.
        Only the jobs finished by now: a commit that ends while held records drain
        waits for the next iteration, so the loop returns to ``consume()`` (taken as
        they come, a slow transform's partitions would drain their whole backlogs
        here, commit after commit, past ``max.poll.interval.ms``)."""
        for partition, (event, error) in list(self.jobs.completions()):
            if error is not None:
                raise error
            if event is None:
                continue
            if self.partitions.get(partition.key) is partition:
                self.dispatch(partition, event)  # type: ignore[arg-type]
            else:
                self.reporter.abandoned(partition, event)
        for key, reported in self.committer.poll(now):
            owner = self.partitions.get(key)
            if owner is not None:
                self.dispatch(owner, reported)
        for topic in self.topics.resolved():
            for partition in list(self.partitions.values()):
                if partition.waiting_topic == topic:
                    partition.waiting_topic = None
                    self.dispatch(partition, sm.TopicResolved(topic))
        # Records handed back at the poll-gap bound (or left by a drain it cut short),
        # the longest held first, before anything consumed since: as far as the bound
        # allows, the rest waits for the next iteration. One paused for the replica's
        # limit with nothing left of its own is checked too, to fetch again.
        waiting = [p for p in self.partitions.values()
                   if (p.held or sm.Pause.BACKLOG in p.state.pauses)
                   and not p.state.holding and p.state.phase is sm.Phase.ACTIVE]
        for partition in sorted(waiting, key=_held_since):
            self.runner.drain(partition)

    def _poll_timeout_s(self) -> float:
        """How long consume() may wait for records: TXSTAGE_POLL_TIMEOUT_MS, but only a
        moment while a commit runs or records are held (a partition committing or paused
        fetches nothing: a full wait after each commit halved a lagging partition's pace)."""
        if self.runner.held_bytes or any(p.state.phase is sm.Phase.COMMITTING
                                   for p in self.partitions.values()):
            return _BUSY_POLL_S
        return self.settings.poll_timeout_ms / 1000

    def tick(self, now: float) -> None:
        policy = self.policy
        self.positions.retry(now)
        for partition in list(self.partitions.values()):
            state = partition.state
            if partition.batch_records:
                tell_written(partition, policy)
                state = partition.state
            if partition.fetched_end is not None:
                end = self.positions.end_reached(partition, now)
                if end is not None:
                    self.dispatch(partition, end)
                state = partition.state
            if state.due(now, policy):
                self.reporter.warn_near_timeout(partition, now, policy)
                self.dispatch(partition, sm.CommitDue(now))
            elif state.resume_at is not None or state.fenced_at is not None:
                self.dispatch(partition, sm.Tick(now))
        self._housekeeping(now)

    def _housekeeping(self, now: float) -> None:
        """Once a second (the housekeeper says when): carry out what it found."""
        chores = self.housekeeper.run(now, self.policy, self.runner.held_bytes, self.pool,
                                      self.limits)
        for partition, event in chores.events:
            self.dispatch(partition, event)
        for partition in chores.restarts:
            self.positions.restart_fetch(partition)
        if chores.interval_s is not None:
            self.policy = replace(self.policy, stretched_interval_s=chores.interval_s)

    def interrupt(self) -> None:
        """The replica stops (signal-handler safe): the batch ends after the record
        being transformed; what was processed is released by the stop."""
        self.runner.stop()

    def dispatch(self, partition: Partition, event: sm.Event) -> None:
        if partition.batch_records:
            tell_written(partition, self.policy)
        error = getattr(event, "error", None)
        if isinstance(error, KafkaOperationError):
            self.reporter.kafka_error(error)
        if (isinstance(error, KafkaOperationError) and error.code in LOOK_AGAIN) or any(
                f.code in LOOK_AGAIN for f in getattr(event, "failures", ())):
            self.limits.forget()  # was an output topic deleted? look each one up again
        before = partition.state
        partition.state, actions = sm.transition(before, event, self.policy)
        if partition.state.phase is not before.phase:
            partition.phase_since, partition.stalled_warned = time.monotonic(), False
            log.debug("partition.phase", topic=partition.topic, partition=partition.partition,
                      phase=partition.state.phase.value, on=type(event).__name__)
            if self.span is not None and partition.state.phase is sm.Phase.ACTIVE:
                self.span.became_active(partition, partition.phase_since)  # before a drain
        for action in actions:
            self._execute(partition, action)

    def _execute(self, partition: Partition, action: sm.Action) -> None:
        match action:
            case sm.PausePartition():
                self.consumer.pause([partition.tp])
            case sm.ResumePartition():
                if not partition.seek.landing:  # else: once the seek lands
                    self.consumer.resume([partition.tp])
            case sm.Seek(offset):
                self.positions.seek(partition, offset)
            case sm.StartInit(replacing):
                if not partition.releasing:
                    self.jobs.start(partition, self.committer.init(partition.key, replacing),
                                    startup=True)
            case sm.LookupPosition(after_commit):
                if not partition.releasing:
                    self.jobs.start(partition, self.positions.lookup(
                        partition, self.limits.cluster, self.overruns, after_commit),
                        startup=True)
            case sm.StartCommit(txn):
                self._run(partition, self.committer.commit(
                    partition.key, txn, self._group_metadata))
                if self.span is not None:
                    self.span.commit_started(partition, time.monotonic())
            case sm.StartAbort(txn):
                self._run(partition, self.committer.abort(partition.key, txn))
                if self.span is not None:
                    self.span.abort_started(time.monotonic())
            case sm.CloseProducer():
                self.jobs.spawn(self.committer.detach(partition.key))
            case sm.DropProducer():
                # Closed once the stuck call returns, if it ever does (a close could
                # hang the same way); a job that had not started is cancelled.
                stuck = self.jobs.write_off(partition, self.committer.detach(partition.key))
                log.error("producer.stuck", topic=partition.topic, partition=partition.partition,
                          transactional_id=self.committer.transactional_id(partition.key),
                          stuck_s=round(time.monotonic() - partition.phase_since, 1),
                          stuck_calls=stuck,
                          note="a thread stays blocked in librdkafka; the producer is "
                               "replaced if the partition is still ours")
                if stuck >= _MAX_STUCK_CALLS:
                    raise FatalError(Where("jobs", None, partition.topic, partition.partition),
                                     KafkaError(KafkaError._FAIL,
                                                f"{stuck} calls on producers are stuck in "
                                                f"librdkafka past their deadlines; a fresh "
                                                f"process is needed"))
            case sm.Finish(txn, commit, reason, deadline):
                work = self.committer.finish(partition.key, txn, commit, reason,
                                             self._group_metadata, deadline)
                if work is not None:
                    self.jobs.start(partition, work)
                if self.span is not None:
                    self.span.abort_started(time.monotonic())
            case sm.Abandon():
                self.jobs.abandon(partition, self.committer.detach(partition.key))
            case sm.DrainHeld():
                self.runner.drain(partition)
            case sm.DropHeld():
                self.runner.discard(partition)
            case sm.LookupTopic(topic):
                self.topics.start(partition, topic, self.limits)
            case sm.Fail(error):
                raise error
            case _:
                self.reporter.report(partition, action, self.policy)

    def _run(self, partition: Partition, work: object) -> None:
        """A committer answer: an event now, or a job to run beside the loop."""
        if callable(work):
            self.jobs.start(partition, work)
        else:
            self.dispatch(partition, work)  # type: ignore[arg-type]

    def assign(self, partitions: list[TopicPartition]) -> None:
        now = time.monotonic()
        self.housekeeper.assigning(now)
        for tp in partitions:
            partition = Partition(tp.topic, tp.partition)
            partition.phase_since = now
            self.partitions[partition.key] = partition
            partition.state, actions = sm.assigned()
            for action in actions:
                self._execute(partition, action)
        self.reporter.partitions()

    def release(self, keys: Iterable[TopicPartitionKey], *, lost: bool, reason: str,
                deadline: float) -> None:
        """Finish and forget these partitions by ``deadline``: first let the work in
        flight end (revoke while committing or aborting), then release each as the
        state machine says, in parallel, and wait for that too."""
        leaving = [self.partitions[key] for key in keys if key in self.partitions]
        for partition in leaving:
            partition.releasing = True
        if self.span is not None and not lost:  # their transaction is every partition's
            self.span.commit_all(deadline, self._dispatch_recording, self.recorded.append)
        # An init's or a position lookup's result is discarded by the release: their
        # jobs end on their own (an init's producer is closed then), nobody waits.
        startup = {partition.key: partition.job for partition in leaving
                   if partition.state.phase in _STARTUP_PHASES}
        for partition in leaving:
            if partition.key in startup:
                continue
            completion = self.jobs.wait(partition, deadline)
            if completion is None:
                continue
            event, error = completion
            if error is not None:
                self.recorded.append(error)
            elif event is not None:
                self._dispatch_recording(partition, event)  # type: ignore[arg-type]
        now = time.monotonic()
        for partition in leaving:
            self._dispatch_recording(partition, sm.Released(lost, now, reason, deadline))
        for partition in leaving:
            # A Finish that overruns closes its own producer. What a job that ended
            # meanwhile found is still reported (a commit that met the successor's fence
            # as a paused replica resumed): taken here, its completion never reaches
            # ``settle``, so unreported here the fence would go unsaid.
            completion = None if partition.job is startup.get(partition.key) else \
                self.jobs.wait(partition, deadline)
            if completion is not None and completion[0] is not None:
                self.reporter.abandoned(partition, completion[0])
            self.runner.discard(partition)
            del self.partitions[partition.key]
            with contextlib.suppress(KeyError):
                self.metrics.consumer_lag.remove(partition.topic, str(partition.partition))
        self.reporter.partitions()

    def _dispatch_recording(self, partition: Partition, event: sm.Event) -> None:
        try:
            self.dispatch(partition, event)
        except BaseException as exc:  # never raise inside a librdkafka callback
            self.recorded.append(exc)

    def record(self, exc: BaseException, where: str) -> None:
        """Keep an error from a callback for the loop thread to raise."""
        log.error("callback.failed", where=where, error=str(exc), error_class=type(exc).__name__)
        self.recorded.append(exc)

    def raise_recorded(self) -> None:
        if self.recorded:
            raise self.recorded[0]

    def consume_error(self, error: KafkaError, msg: Message) -> None:
        topic, number = msg.topic(), msg.partition()
        if error.code() == KafkaError._PARTITION_EOF:
            # The fetcher reached the end: past commit markers and aborted records,
            # which take offsets but are never delivered (committed, and the lag
            # gauge's end).
            partition = self.partitions.get((topic, number))  # type: ignore[arg-type]
            if partition is not None:
                self.positions.fetched_to_end(partition, msg.offset())  # type: ignore[arg-type]
            return
        if error.code() in DENIALS:  # a missing ACL never heals by itself
            raise DeniedError(Where("consume", topic=topic, partition=number), error)
        if error.fatal() or error.code() == KafkaError._FATAL:  # its cause, flagged or not
            raise FatalError(Where("consume"), error)
        log.warning("kafka.consume_error", code=error.name(), error=error.str())


def _held_since(partition: Partition) -> float:
    return partition.held_since

