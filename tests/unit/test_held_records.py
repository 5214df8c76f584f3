"""A record held while its output topic is looked up keeps what the transform yielded
for it, so the transform runs once per record even when the record is held again.

The old loop lost it when a commit ended while the lookup ran: draining the held
records swapped ``partition.saved`` out, the record was held again (the lookup still
pending) without its outputs, and once the topic was known the transform ran a
second time on it (twice a side effect, or a different answer from a
non-deterministic transform)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace

from service.contract.processing import TopicLimitPending
from service.contract.records import Output, Record
from service.stage import machine as sm
from tests.unit.fakes import ScriptedConsumer, batch, make_loop, positioned


def test_a_record_held_again_after_a_commit_is_not_transformed_twice() -> None:
    calls: Counter[int] = Counter()

    def transform(record: Record) -> Iterator[Output]:
        calls[record.offset] += 1
        yield Output(b"v", topic="elsewhere" if record.offset == 3 else None)

    known = {"out": 1_000_000}
    resolved = threading.Event()

    def lookup(topic: str) -> int:
        if topic in known:
            return known[topic]
        raise TopicLimitPending(topic)

    def resolve(topic: str) -> None:
        resolved.wait(10)
        known[topic] = 1_000_000

    consumer = ScriptedConsumer(batches=[batch(0, 5)])
    loop, committer, partition = make_loop(consumer)
    loop.transform = transform
    loop.limits = SimpleNamespace(lookup=lookup, resolve=resolve)  # type: ignore[assignment]
    committer.commit = lambda key, txn, metadata: sm.CommitDone(  # type: ignore[attr-defined]
        0.0, time.monotonic())
    committer.transactional_id = lambda key: "g.in.0"  # type: ignore[attr-defined]
    loop.consumer.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    positioned(loop, partition, 0)
    loop.iterate()  # 0-2 written; 3 held for the lookup with what it yielded, 4-5 behind it
    assert [m.offset() for m in partition.held] == [3, 4, 5]
    loop.dispatch(partition, sm.CommitDue(time.monotonic()))  # 0-2 commit; 3 held again
    assert [m.offset() for m in partition.held] == [3, 4, 5]
    assert 3 in partition.saved
    resolved.set()
    deadline = time.monotonic() + 5
    while partition.held and time.monotonic() < deadline:
        loop.settle(time.monotonic())
        time.sleep(0.01)
    assert committer.written == [0, 1, 2, 3, 4, 5]
    assert calls == {offset: 1 for offset in range(6)}


def test_a_lookup_of_its_own_runs_instead_of_a_topics() -> None:
    """A pending record that says how to wait (a schema registry that did not answer:
    service.formats) is held while that runs beside the loop, not a topic lookup."""
    registry_up = threading.Event()
    waited: list[str] = []

    def wait_for_registry() -> bool:
        waited.append("registry")
        return registry_up.wait(10)

    def transform(record: Record) -> Iterator[Output]:
        if record.offset == 2 and not registry_up.is_set():
            pending = TopicLimitPending("schema registry: schema id 7")
            pending.lookup = wait_for_registry
            raise pending
        yield Output(b"v")

    def no_topic_lookup(topic: str) -> None:
        raise AssertionError(f"looked up {topic!r} as a topic")

    consumer = ScriptedConsumer(batches=[batch(0, 4)])
    loop, committer, partition = make_loop(consumer)
    loop.transform = transform
    loop.limits = SimpleNamespace(lookup=lambda topic: 1_000_000,  # type: ignore[assignment]
                                  resolve=no_topic_lookup)
    positioned(loop, partition, 0)
    loop.iterate()
    assert [m.offset() for m in partition.held] == [2, 3, 4]
    registry_up.set()
    deadline = time.monotonic() + 5
    while partition.held and time.monotonic() < deadline:
        loop.settle(time.monotonic())
        time.sleep(0.01)
    assert waited == ["registry"]
    assert committer.written == [0, 1, 2, 3, 4]
