"""Where a Kafka-sink backfill writes each topic its outputs name: never into a live
topic unless that topic is named for it (docs/backfill.md, "Topics").

Every output topic is mapped to a sink topic explicitly: the default output topic by
``--sink kafka://<topic>`` (or ``--output-topic``), the dead-letter topic by
``--dlq-topic``, and every topic the transform names (``Output(topic=...)``) by
``--topic-map <topic>=<sink topic>`` or one rule for all, ``--topic-suffix <suffix>``.
A topic that comes only from the stage's settings (``TXSTAGE_OUTPUT_TOPIC``,
``TXSTAGE_DLQ_TOPIC``) or from the transform is the stage's live topic: unmapped, it
is refused before anything is written (exit 2). ``--topic-map side=side`` writes into
the live ``side`` because it names it.

Kafka-free: the map is applied to ``processing.Result`` inside the Spark tasks and
checked on the driver against a sample of each slice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from service.contract.processing import Produced, Result
from service.contract.records import Record
from service.errors import ConfigError


class UnmappedTopicError(ValueError):
    """An output names a topic the backfill was not told where to write."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(unmapped_problem(topic))


def unmapped_problem(topic: str, seen_at: str | None = None) -> str:
    where = f" (first at input {seen_at})" if seen_at else ""
    return (f"the transform writes to topic {topic!r}{where}, which this backfill does not "
            f"map: add --topic-map {topic}=<sink topic> or --topic-suffix <suffix> "
            f"(--topic-map {topic}={topic} writes into the live topic)")


def missing_problem(topic: str, sink: str, seen_at: str, rule: str) -> str:
    """A sink topic the sample writes to that does not exist: where, and the two fixes."""
    return (f"sink topic {sink!r} does not exist: the transform writes to {topic!r} (first "
            f"at input {seen_at}), mapped by {rule}: create it (txstage topics create "
            f"--topic {sink}) or map {topic!r} elsewhere (--topic-map {topic}=<sink topic>)")


@dataclass(frozen=True, slots=True)
class TopicMap:
    """``topic -> sink topic``; ``keep``: the sink's own default and dead-letter topics,
    written as they are; ``suffix``: the rule for every other topic; ``strict``: an
    unmapped topic is refused (a Kafka sink) rather than kept (a Parquet sink)."""

    named: Mapping[str, str] = field(default_factory=dict)
    suffix: str | None = None
    keep: frozenset[str] = frozenset()
    strict: bool = True

    def __call__(self, topic: str) -> str:
        if topic in self.keep:
            return topic
        found = self.named.get(topic)
        if found is not None:
            return found
        if self.suffix:
            return topic + self.suffix
        if self.strict:
            raise UnmappedTopicError(topic)
        return topic

    def maps(self, topic: str) -> bool:
        """Whether ``topic`` has somewhere to go (kept, named or suffixed)."""
        return topic in self.keep or topic in self.named or bool(self.suffix) \
            or not self.strict

    def how(self, topic: str) -> str:
        """How ``topic`` is mapped, for the plan: ``-> side-v2 (--topic-map)``."""
        if not self.maps(topic):
            return "NOT MAPPED"
        sink = self(topic)
        live = " (the live topic)" if sink == topic and topic not in self.keep else ""
        return f"-> {sink} ({self.rule(topic)}){live}"

    def rule(self, topic: str) -> str:
        """What maps ``topic`` (one that ``maps``): ``--topic-suffix -v2``, ..."""
        return "named" if topic in self.keep else "--topic-map" if topic in self.named else \
            f"--topic-suffix {self.suffix}" if self.suffix else "kept"

    def live(self, sink: str) -> str:
        """The stage's topic written to ``sink`` (``sink`` when none): its schema
        registry subject is the one a backfill encodes for, as the stream does."""
        return next((topic for topic, mapped in self.named.items() if mapped == sink), sink)

    def targets(self) -> set[str]:
        """The sink topics named up front (suffixed ones are known once seen)."""
        return {*self.keep, *self.named.values()}

    def applied(self, process: Callable[[Record], Result]) -> Callable[[Record], Result]:
        """``process`` with every output's topic mapped (before it is produced)."""
        if not self.named and not self.suffix and not self.strict:
            return process
        keep = self.keep

        def mapped(record: Record) -> Result:
            result = process(record)
            outputs = result.outputs
            if all(out.topic in keep for out in outputs):
                return result
            return Result([Produced(self(out.topic), out.key, out.value, out.headers)
                           for out in outputs], result.error)
        return mapped


def parse_pairs(items: Sequence[str]) -> dict[str, str]:
    """``--topic-map A=B`` (repeatable) as a dict; ConfigError names a malformed one."""
    found: dict[str, str] = {}
    for item in items:
        topic, sep, sink = item.partition("=")
        if not sep or not topic.strip() or not sink.strip():
            raise ConfigError(f"--topic-map {item!r}: expected <topic>=<sink topic>")
        if topic in found and found[topic] != sink:
            raise ConfigError(f"--topic-map maps {topic!r} twice ({found[topic]}, {sink})")
        found[topic.strip()] = sink.strip()
    return found
