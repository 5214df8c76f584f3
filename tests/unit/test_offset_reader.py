"""Offsets read back with ListOffsets (service.kafka.reading, the stage's high
watermarks, the LSO watch, the backfill's plan): a partition librdkafka did not answer
for is asked again or left out, never taken for an offset.

While a killed broker's partitions have no leader yet, librdkafka's ListOffsets can
answer -1001 (OFFSET_INVALID) with no error. Taken as an end offset, -1001 made "the
group committed everything" true at once (any committed offset is >= -1001): a test
then checked exactly-once while the stage was still catching up."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, ClassVar

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ListOffsetsResultInfo, OffsetSpec

from service.kafka import reading


class ScriptedAdmin:
    """An AdminClient whose list_offsets answers each call from a script: per call, a
    partition -> offset (or KafkaError) mapping."""

    calls: ClassVar[list[dict[TopicPartition, Any]]] = []
    script: ClassVar[Iterator[dict[int, int | KafkaError]]] = iter(())

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any
                     ) -> dict[TopicPartition, Future[ListOffsetsResultInfo]]:
        ScriptedAdmin.calls.append(request)
        answers = next(ScriptedAdmin.script)
        futures: dict[TopicPartition, Future[ListOffsetsResultInfo]] = {}
        for tp in request:
            future: Future[ListOffsetsResultInfo] = Future()
            answer = answers[tp.partition]
            if isinstance(answer, KafkaError):
                future.set_exception(KafkaException(answer))
            else:
                future.set_result(ListOffsetsResultInfo(answer, -1, -1))
            futures[tp] = future
        return futures


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedAdmin]:
    monkeypatch.setattr(reading, "AdminClient", ScriptedAdmin)
    ScriptedAdmin.calls = []
    return ScriptedAdmin


WANTED = [("t", 0), ("t", 1)]


def test_an_end_offset_not_answered_for_is_asked_again(admin: type[ScriptedAdmin]) -> None:
    admin.script = iter([{0: OFFSET_INVALID, 1: 2500}, {0: 2500, 1: 2500}])
    with reading.OffsetReader({"bootstrap.servers": "x"}) as reader:
        assert reader.end_offsets(WANTED, timeout_s=5) == {("t", 0): 2500, ("t", 1): 2500}
    assert len(admin.calls) == 2


def test_a_leader_moving_in_is_asked_again(admin: type[ScriptedAdmin]) -> None:
    moving = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
    admin.script = iter([{0: moving, 1: 7}, {0: 3, 1: 7}])
    assert reading.list_offsets({}, WANTED, reading.LATEST, timeout_s=5) == {
        ("t", 0): 3, ("t", 1): 7}


def test_an_offset_never_answered_fails_with_librdkafkas_error(
        admin: type[ScriptedAdmin]) -> None:
    admin.script = iter([{0: OFFSET_INVALID, 1: 1}] * 1000)
    with pytest.raises(KafkaException), reading.OffsetReader({}) as reader:
        reader.end_offsets(WANTED, timeout_s=0.5)


def test_a_timestamp_with_no_offset_is_an_answer(admin: type[ScriptedAdmin]) -> None:
    admin.script = iter([{0: -1, 1: 12}])
    found = reading.list_offsets({}, WANTED, OffsetSpec.for_timestamp(1000), timeout_s=5)
    assert found == {("t", 0): -1, ("t", 1): 12}
    assert len(admin.calls) == 1


def test_an_error_that_is_not_a_moving_leader_is_raised_at_once(
        admin: type[ScriptedAdmin]) -> None:
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    admin.script = iter([{0: denied, 1: 1}])
    with pytest.raises(KafkaException):
        reading.list_offsets({}, WANTED, reading.LATEST, timeout_s=5)
    assert len(admin.calls) == 1


def test_a_backfill_range_is_never_planned_from_an_unanswered_offset() -> None:
    from service.backfill import offsets

    ScriptedAdmin.calls = []
    ScriptedAdmin.script = iter([{0: 2500, 1: OFFSET_INVALID}, {0: 2500, 1: 2400}])
    found = offsets._list(ScriptedAdmin({}), "t", [0, 1], reading.LATEST)  # type: ignore[arg-type]
    assert found == {0: 2500, 1: 2400}


def test_the_stages_high_watermarks_leave_an_unanswered_partition_out() -> None:
    from service.kafka.cluster import Cluster

    cluster = Cluster({"bootstrap.servers": "127.0.0.1:1"})
    cluster._admin = ScriptedAdmin({})  # type: ignore[assignment]
    ScriptedAdmin.script = iter([{0: OFFSET_INVALID, 1: 7}])
    assert cluster.high_watermarks(WANTED, timeout_s=1) == {("t", 1): 7}


def test_the_lso_watch_leaves_an_unanswered_partition_out() -> None:
    from prometheus_client import CollectorRegistry, Gauge

    from service.observability.lso_watch import LsoWatch

    registry = CollectorRegistry()
    watch = LsoWatch({"bootstrap.servers": "127.0.0.1:1"}, {"output": ["t"]},
                     Gauge("lag", "", ["role", "topic", "partition"], registry=registry),
                     Gauge("stuck", "", ["role", "topic", "partition"], registry=registry),
                     interval_s=60)
    watch._admin = ScriptedAdmin({})  # type: ignore[assignment]
    ScriptedAdmin.script = iter([{0: OFFSET_INVALID, 1: 7}])
    assert watch._list([("output", "t", 0), ("output", "t", 1)],
                       reading.IsolationLevel.READ_UNCOMMITTED) == {("output", "t", 1): 7}
