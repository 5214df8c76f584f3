"""One record → its outputs: lineage, dead letters, size limits; no Kafka involved."""

from collections.abc import Iterator

import pytest

from service import Output, Record
from service.contract import lineage
from service.contract.deadletter import ERROR_CLASS, ERROR_OFFSET
from service.contract.processing import process
from service.errors import PoisonRecordError
from service.examples.fanout import split_lines
from service.examples.filter import evens
from service.examples.square import square

RECORD = Record("in", 2, 40, 1_700_000_000_000, b"k", b"12", (("h", b"v"),))


def unlimited(topic: str) -> int:
    return 1_000_000


def run(fn, record=RECORD, dlq="dlq", limit=unlimited):  # type: ignore[no-untyped-def]
    return process(fn, record, default_topic="out", dlq_topic=dlq, max_bytes=limit)


def test_outputs_carry_lineage_in_order() -> None:
    record = Record("in", 1, 9, 0, b"k", b"a\nb\nc")
    result = run(split_lines, record)
    assert [o.topic for o in result.outputs] == ["out", "out", "out", "txstage-summary"]
    parsed = [lineage.read(o.headers) for o in result.outputs]
    assert parsed == [lineage.Lineage("in", 1, 9, i) for i in range(4)]


def test_square_keeps_key_and_squares() -> None:
    (out,) = run(square).outputs
    assert (out.topic, out.key, out.value) == ("out", b"k", b"144")


def test_filter_may_produce_nothing() -> None:
    assert run(evens, Record("in", 0, 1, 0, None, b"3")).outputs == []
    assert not run(evens, Record("in", 0, 1, 0, None, b"3")).dead_lettered


def test_failing_transform_is_dead_lettered_with_coordinates() -> None:
    result = run(square, Record("in", 2, 41, 0, b"k", b"not a number", (("h", b"v"),)))
    (letter,) = result.outputs
    headers = dict(letter.headers)
    assert letter.topic == "dlq" and letter.value == b"not a number" and letter.key == b"k"
    assert headers[ERROR_CLASS] == b"ValueError" and headers[ERROR_OFFSET] == b"41"
    assert headers["h"] == b"v"
    assert lineage.read(letter.headers) == lineage.Lineage("in", 2, 41, 0)


def test_without_dlq_a_failure_is_a_poison_record_error() -> None:
    with pytest.raises(PoisonRecordError) as caught:
        run(square, Record("in", 2, 41, 0, None, b"x"), dlq=None)
    assert (caught.value.topic, caught.value.partition, caught.value.offset) == ("in", 2, 41)


def test_output_above_the_topic_limit_is_dead_lettered_not_produced() -> None:
    def big(record: Record) -> Iterator[Output]:
        yield Output(value=b"x" * 5000)

    result = run(big, limit=lambda topic: 1000 if topic == "out" else 10_000)
    assert result.dead_lettered and result.outputs[0].topic == "dlq"
    assert "limit is 1000 bytes" in str(result.error)


def test_a_failure_midway_produces_none_of_the_outputs() -> None:
    def half(record: Record) -> Iterator[Output]:
        yield Output(value=b"first")
        raise RuntimeError("second failed")

    result = run(half)
    assert [o.topic for o in result.outputs] == ["dlq"]


def test_wrong_output_types_are_rejected() -> None:
    def wrong(record: Record) -> Iterator[object]:
        yield "a string"

    assert isinstance(run(wrong).error, TypeError)  # type: ignore[arg-type]


def test_a_cluster_failure_looking_up_a_limit_is_never_blamed_on_the_record() -> None:
    from unittest.mock import MagicMock

    from service.errors import KafkaOperationError
    from service.kafka.cluster import Cluster, OutputLimits

    cluster = Cluster({"bootstrap.servers": "127.0.0.1:1"})
    future = MagicMock()
    future.result.side_effect = TimeoutError()  # what concurrent.futures raises
    cluster._admin = MagicMock()
    cluster._admin.describe_configs.side_effect = lambda resources: {resources[0]: future}
    with pytest.raises(KafkaOperationError):
        run(square, limit=OutputLimits(cluster, 1_000_000, deadline_s=0))  # no retries


def test_a_record_waiting_for_a_topic_lookup_keeps_what_the_transform_yielded() -> None:
    from service.contract.processing import TopicLimitPending

    runs = []

    def routed(record: Record) -> Iterator[Output]:
        runs.append(record.offset)
        yield Output(value=b"a", key=b"k", headers=(("h", b"v"),))
        yield Output(value=b"b", topic="side")
        yield Output(value=b"c")

    def pending_for_side(topic: str) -> int:
        if topic == "side":
            raise TopicLimitPending(topic)
        return 1_000_000

    with pytest.raises(TopicLimitPending) as waiting:
        run(routed, limit=pending_for_side)
    kept = waiting.value.outputs
    assert kept is not None and runs == [40]
    replayed = run(lambda record: kept)
    assert runs == [40], "the transform must not run again"
    assert replayed.outputs == run(routed).outputs


def test_a_failure_after_a_pending_lookup_is_still_the_records() -> None:
    from service.contract.processing import TopicLimitPending

    def fails_late(record: Record) -> Iterator[Output]:
        yield Output(value=b"b", topic="side")
        raise RuntimeError("late")

    def pending(topic: str) -> int:
        if topic == "side":
            raise TopicLimitPending(topic)
        return unlimited(topic)  # the dead-letter topic's limit is known

    result = run(fails_late, limit=pending)
    assert result.dead_lettered and "late" in str(result.error)


class _Topics:
    """A cluster whose topic ``out`` allows 2,000 bytes and ``gone`` does not exist."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def topic_config(self, topic: str) -> dict[str, str]:
        from service.kafka.cluster import UnknownTopicError

        self.asked.append(topic)
        if topic == "gone":
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        return {"max.message.bytes": "2000"}


def test_output_limits_ask_once_per_topic_and_remember_an_unknown_one() -> None:
    from typing import cast

    from service.contract.processing import TopicLimitPending
    from service.kafka.cluster import Cluster, OutputLimits, UnknownTopicError

    cluster = _Topics()
    limits = OutputLimits(cast(Cluster, cluster), 1_000_000)  # blocking: asks at once
    assert limits.lookup("out") == limits("out") == 2000
    for _ in range(3):
        with pytest.raises(UnknownTopicError):
            limits.lookup("gone")
    assert cluster.asked == ["out", "gone"], "an answer, known or unknown, is kept"

    stage = OutputLimits(cast(Cluster, cluster), 1_000, blocking=False)
    with pytest.raises(TopicLimitPending):
        stage.lookup("out")
    stage.resolve("out")  # beside the loop
    assert stage.lookup("out") == 1_000  # the producer's own limit is the smaller
