"""The redrive loop. Exactly once because each letter's outputs and its *progress mark*
(key ``<dlq topic>/<partition>/<offset>`` in the compacted topic
``<prefix>.redrive.progress``) are written in one transaction of one producer,
``<prefix>.redrive.<dlq topic>``:

1. ``init_transactions`` fences any other redrive of this DLQ and finishes (commits or
   aborts) its last transaction;
2. only then the progress topic is read (read_committed, to its end): the letters
   already redriven, by any earlier run, are skipped;
3. the DLQ is read up to its last stable offset taken at start (letters written later,
   including this run's own re-dead-letters, wait for the next run); every matching
   letter is rebuilt, run through the transform and written with its mark, a batch
   per transaction. A crash aborts the open batch, outputs and marks together.

An output the broker refuses aborts the batch; it is retried with that letter dead-
lettered again (as the stage does), up to three times.

A letter that fails again goes back to the DLQ with its attempt + 1, unless that reaches
``max_attempts``: then it goes to the parking topic (``<dlq topic>.parked``), in the same
transaction as its progress mark. The DLQ is read to its end on every run, so letters
that can never succeed would otherwise come back, one more each, on every scheduled run.

Parking is one place. A letter already parked (``txstage.redrive.parked``, read when the
parking topic is redriven) that fails again is left where it is: nothing is written for
it and it gets no progress mark, so the next redrive of the parking topic tries it again
and the topic does not grow. The parking topic of a parking topic is itself
(letters.parking_topic_of): no ``<dlq>.parked.parked``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Message
from confluent_kafka.admin import AdminClient

from service.contract.letters import ATTEMPT, PARKED, REDRIVEN, Letter, parking_topic_of, parse
from service.contract.processing import OutputRefusedError, Produced, Result, process, refused
from service.contract.records import Transform
from service.errors import AbortableError, DeniedError, UnfinishedError
from service.kafka import reading
from service.kafka.cluster import UnknownTopicError
from service.kafka.producer import PinnedProducer
from service.kafka.reading import EARLIEST, LATEST
from service.kafka.topics import create_topic
from service.tools.redrive.letters import Filter

_ATTEMPTS = 3  # commits of one batch, each after a refusal
MAX_ATTEMPTS = 3  # --max-attempts: the attempt at which a letter that fails is parked


@dataclass
class RedriveReport:
    letters: int = 0  # txstage dead letters read in the window
    not_letters: int = 0  # records of the DLQ without txstage's error headers
    incomplete: int = 0  # letters cut to fit their topic: the original is not all there
    done_before: int = 0  # redriven by an earlier run
    filtered_out: int = 0
    redriven: int = 0  # the transform succeeded: outputs written
    outputs: int = 0
    failed_again: int = 0  # dead-lettered again, attempt + 1
    parked: int = 0  # failed again at attempt max_attempts: to the parking topic instead
    left_parked: int = 0  # parked letters that failed again: left where they are
    parking_topic: str = ""  # where parked letters are
    max_attempts: int = MAX_ATTEMPTS
    transactions: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    examples: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        handled = self.redriven + self.failed_again + self.parked + self.left_parked
        return handled / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        fields = dict(vars(self))
        fields["letters_per_second"] = round(self.rate)
        fields["seconds"] = round(self.seconds, 3)
        return fields

    def summary(self) -> str:
        verb = "would redrive" if self.dry_run else "redrove"
        lines = [f"{self.letters} dead letters read; {self.done_before} redriven before, "
                 f"{self.filtered_out} filtered out"
                 + (f", {self.incomplete} cut to fit (not redriven)" if self.incomplete else ""),
                 f"{verb} {self.redriven} ({self.outputs} outputs), "
                 f"{'would dead-letter' if self.dry_run else 'dead-lettered'} "
                 f"{self.failed_again} again and {'would park' if self.dry_run else 'parked'} "
                 f"{self.parked} (failed {self.max_attempts} times), in {self.seconds:.1f} s "
                 f"({self.rate:,.0f} letters/s, {self.transactions} transactions)"]
        if self.left_parked:
            lines.append(f"{self.left_parked} parked letters failed again: left parked in "
                         f"{self.parking_topic or 'the parking topic'}")
        lines += [f"  e.g. {example}" for example in self.examples]
        return "\n".join(lines)


def progress_topic(prefix: str) -> str:
    return f"{prefix}.redrive.progress"


def transactional_id(prefix: str, dlq_topic: str) -> str:
    """One id per DLQ: a second redrive of it fences the first."""
    return f"{prefix}.redrive.{dlq_topic}"


def redrive(*, producer_config: Mapping[str, Any], admin_config: Mapping[str, Any],
            dlq_topic: str, transform: Transform, default_topic: str, prefix: str,
            letter_filter: Filter, max_bytes: Callable[[str], int], dry_run: bool = False,
            batch: int = 500, timeout_s: float = 300.0, max_examples: int = 10,
            deadline_s: float = 90.0, max_attempts: int = MAX_ATTEMPTS,
            parking_topic: str | None = None) -> RedriveReport:
    """Redrive the letters of ``dlq_topic`` that ``letter_filter`` takes and no run has
    redriven. ``producer_config``: a transactional producer's (kafka_config.producer_config
    with ``transactional_id(prefix, dlq_topic)``; that id is set here either way).
    ``parking_topic``: None for ``parking_topic_of(dlq_topic)``."""
    began = time.monotonic()
    parking = parking_topic or parking_topic_of(dlq_topic)
    report = RedriveReport(dry_run=dry_run, max_attempts=max_attempts, parking_topic=parking)
    producer = None
    marks = progress_topic(prefix)
    dlq = reading.partitions(admin_config, [dlq_topic])
    if not dry_run:
        _ensure_topic(admin_config, marks, partitions=1, config={"cleanup.policy": "compact"})
        # Not compacted: letters of different originals share keys. As large a letter as
        # the DLQ takes, so none is cut further on its way to being parked. (A parking
        # topic that exists already is used as it is; the letters are fitted to it.)
        _ensure_topic(admin_config, parking, partitions=len(dlq),
                      config={"max.message.bytes": str(max_bytes(dlq_topic))})
        config = {**producer_config, "transactional.id": transactional_id(prefix, dlq_topic)}
        producer = PinnedProducer(config, dlq_topic, 0, deadline_s=deadline_s)
        producer.init()  # from here, no other redrive of this DLQ commits anything
    try:
        done = _done(admin_config, marks, prefix, timeout_s)
        writer = _Writer(producer, marks, transform, default_topic, dlq_topic, max_bytes,
                         report, max_examples, max_attempts=max_attempts, parking_topic=parking)
        starts = reading.list_offsets(admin_config, dlq, EARLIEST)
        ends = reading.list_offsets(admin_config, dlq, LATEST)

        def on_message(msg: Message) -> None:
            timestamp = int(msg.timestamp()[1])
            headers = cast(list[tuple[str, bytes | None]], msg.headers() or [])
            letter = parse(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0),
                           timestamp, msg.key(), msg.value(), headers)
            if letter is None:
                report.not_letters += 1
                return
            report.letters += 1
            if letter.coordinates in done:
                report.done_before += 1
            elif letter.dropped - {"message"}:
                report.incomplete += 1
                if len(report.examples) < max_examples:
                    report.examples.append(f"{letter.coordinates}: not redriven, the letter "
                                           f"left out the original's "
                                           f"{', '.join(sorted(letter.dropped))} to fit")
            elif not letter_filter(letter, timestamp):
                report.filtered_out += 1
            else:
                writer.add(letter)
                if len(writer.pending) >= batch:
                    writer.flush()

        reading.read(admin_config, f"{prefix}.redrive", {k: (starts[k], ends[k]) for k in dlq},
                     on_message, timeout_s=timeout_s)
        writer.flush()
    finally:
        if producer is not None:
            producer.close()
    report.seconds = time.monotonic() - began
    return report


class _Writer:
    def __init__(self, producer: PinnedProducer | None, marks: str, transform: Transform,
                 default_topic: str, dlq_topic: str, max_bytes: Callable[[str], int],
                 report: RedriveReport, max_examples: int, *,
                 max_attempts: int = MAX_ATTEMPTS, parking_topic: str | None = None) -> None:
        self.producer, self.marks, self.transform = producer, marks, transform
        self.default_topic, self.dlq_topic, self.max_bytes = default_topic, dlq_topic, max_bytes
        self.report, self.max_examples = report, max_examples
        self.max_attempts = max_attempts
        self.parking_topic = parking_topic or parking_topic_of(dlq_topic)
        self.pending: list[tuple[Letter, Result]] = []

    def parks(self, letter: Letter) -> bool:
        """Whether ``letter`` goes to the parking topic if it fails again."""
        return letter.attempt + 1 >= self.max_attempts

    @staticmethod
    def stays(letter: Letter, result: Result) -> bool:
        """A parked letter that fails again stays where it is: nothing is written for
        it, no progress mark (parking is one place; the next redrive of the parking
        topic tries it again)."""
        return letter.parked and result.dead_lettered

    def _letters_to(self, letter: Letter) -> str:
        return self.parking_topic if self.parks(letter) else self.dlq_topic

    def _max_bytes(self, topic: str) -> int:
        """``max_bytes``, but a dry run, which creates nothing, fits a letter to be parked
        in a parking topic not created yet as the real run would: to the DLQ's limit."""
        if topic == self.parking_topic and self.producer is None:
            try:
                return self.max_bytes(topic)
            except UnknownTopicError:
                return self.max_bytes(self.dlq_topic)
        return self.max_bytes(topic)

    def add(self, letter: Letter) -> None:
        # A letter that fails now is built for the topic it will go to (fitted to that
        # topic's limit), as the stage builds one for its DLQ.
        result = process(self.transform, letter.original, default_topic=self.default_topic,
                         dlq_topic=self._letters_to(letter), max_bytes=self._max_bytes)
        self.pending.append((letter, result))

    def flush(self) -> None:
        if not self.pending:
            return
        if self.producer is not None:
            self._commit(self.producer)
        for letter, result in self.pending:
            if result.dead_lettered:
                outcome = f"fails again: {type(result.error).__qualname__}: {result.error}"
                if self.stays(letter, result):
                    self.report.left_parked += 1
                    outcome += f"; stays parked in {letter.topic}"
                elif self.parks(letter):
                    self.report.parked += 1
                    outcome += f"; parked in {self.parking_topic} (attempt {letter.attempt + 1})"
                else:
                    self.report.failed_again += 1
            else:
                self.report.redriven += 1
                self.report.outputs += len(result.outputs)
                outcome = f"{len(result.outputs)} output(s)"
            if len(self.report.examples) < self.max_examples:
                original = letter.original
                self.report.examples.append(
                    f"{letter.coordinates} ({letter.error_class}, from {original.topic}/"
                    f"{original.partition}/{original.offset}): {outcome}")
        self.pending = []

    def _commit(self, producer: PinnedProducer) -> None:
        """Write the batch in one transaction. A failed delivery names the number the
        producer was given with the output: here the letter's index in the batch, not
        its offset, which is unique only within its DLQ partition (a refusal of
        ``dlq/0/5``'s output would re-dead-letter ``dlq/1/5`` too)."""
        for attempt in range(_ATTEMPTS):
            if all(self.stays(letter, result) for letter, result in self.pending):
                return  # nothing to write
            producer.begin()
            for index, (letter, result) in enumerate(self.pending):
                if self.stays(letter, result):
                    continue
                parked = result.dead_lettered and self.parks(letter)
                producer.produce_all(_marked(letter, result, parked=parked), index)
                mark = {"outputs": 0 if result.dead_lettered else len(result.outputs),
                        "dead_lettered": result.dead_lettered, "parked": parked,
                        "at": int(time.time() * 1000)}
                producer.produce(Produced(self.marks, letter.coordinates.encode(),
                                          json.dumps(mark).encode(), []), index, partition=0)
            try:
                producer.commit()
                self.report.transactions += 1
                return
            except AbortableError:
                failures = producer.take_failures()
                producer.abort()
                refusals = {f.offset for f in failures if f.refusal and f.offset is not None}
                if not refusals or attempt == _ATTEMPTS - 1:
                    raise
                self.pending = [
                    (letter, refused(letter.original, OutputRefusedError(
                        "the broker refused an output of the redriven record"),
                        self._letters_to(letter), self._max_bytes)
                     if index in refusals else result)
                    for index, (letter, result) in enumerate(self.pending)]


def _marked(letter: Letter, result: Result, *, parked: bool = False) -> list[Produced]:
    if result.dead_lettered:
        marks = [(ATTEMPT, str(letter.attempt + 1).encode())]
        if parked:
            marks.append((PARKED, b"1"))
        return [Produced(out.topic, out.key, out.value, [*out.headers, *marks])
                for out in result.outputs]
    return [Produced(out.topic, out.key, out.value,
                     [*out.headers, (REDRIVEN, letter.coordinates.encode())])
            for out in result.outputs]


def _ensure_topic(admin_config: Mapping[str, Any], topic: str, *, partitions: int,
                  config: Mapping[str, str]) -> None:
    """Create ``topic`` on first use (``config`` applies only then: one that exists is
    left as it is) and wait until it can be written to."""
    admin = AdminClient(dict(admin_config))  # kept until the result is in: it dies with it
    try:
        create_topic(admin, topic, partitions=partitions, config=config, timeout_s=60)
    except DeniedError as exc:
        # A grant to add, not a cluster to wait for: exit 2 naming it (tools/common),
        # not 4, whose "a rerun resumes" would not help.
        raise PermissionError(f"missing permission: {exc.permission}") from exc
    deadline = time.monotonic() + 30  # a new topic has no leader for a moment
    while time.monotonic() < deadline:
        described = admin.list_topics(topic, timeout=10).topics.get(topic)
        if described is not None and described.error is None and all(
                p.leader >= 0 for p in described.partitions.values()):
            return
        time.sleep(0.1)
    raise UnfinishedError(f"{topic} has no leader 30 s after its creation")


def _done(admin_config: Mapping[str, Any], topic: str, prefix: str,
          timeout_s: float) -> set[str]:
    """The letters redriven by any committed run: the progress topic's keys."""
    found: set[str] = set()
    try:
        part = reading.partitions(admin_config, [topic])
    except LookupError:  # no run wrote progress yet (a dry run does not create it)
        return found
    start = reading.list_offsets(admin_config, part, EARLIEST)
    end = reading.list_offsets(admin_config, part, LATEST)

    def keep(msg: Message) -> None:
        key = msg.key()
        if key is not None and msg.value() is not None:
            found.add(key.decode() if isinstance(key, bytes) else str(key))

    reading.read(admin_config, f"{prefix}.redrive", {k: (start[k], end[k]) for k in part},
                 keep, timeout_s=timeout_s)
    return found
