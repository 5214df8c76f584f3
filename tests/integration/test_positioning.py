"""Where a partition resumes: the stage's own lookup of the committed offset answers
before librdkafka's (held by the fault proxy), so the seek is refused with _STATE
(not fetching yet). The partition must stay paused and be sought again until the
seek lands, then process exactly once from the committed offset; a seek refused
for longer than TXSTAGE_FETCH_STALL_S (librdkafka's query never answered) is replaced
by assigning the partition afresh at that offset.

The old stage took the refusal to mean "librdkafka starts from the committed offset
itself" and resumed at once, leaving librdkafka's application position as it was
(see docs/state-machine.md, "A seek is checked, not trusted"; the scripted cases are
in tests/unit/test_positioning.py).

Takes ≈ 72 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.harness.kafka import KafkaService, ProxiedKafka
from tests.harness.proxy import Api
from tests.harness.reading import read_topic
from tests.harness.stage import PARTITIONS, StageSetup, produce_inputs, wait_for
from tests.integration.test_compound_faults import compacted_topic

pytestmark = pytest.mark.kafka


def test_a_seek_refused_before_the_fetcher_starts_lands_later(
        proxied_kafka: ProxiedKafka, stage_on: Callable[[KafkaService], StageSetup]) -> None:
    stage = stage_on(proxied_kafka)  # type: ignore[arg-type]
    produce_inputs(proxied_kafka.direct_bootstrap, stage.input_topic, range(400), PARTITIONS)
    held = proxied_kafka.proxy.delay_request(Api.OFFSET_FETCH, 3.0,
                                             client_id="txstage-*-consumer-*", duration_s=20)
    replica = stage.replica("a")
    wait_for(lambda: bool(replica.events("partition.seek_deferred")), 30,
             "a seek refused while librdkafka's committed-offset query is held", stage.logs)
    proxied_kafka.proxy.clear(held)
    produce_inputs(proxied_kafka.direct_bootstrap, stage.input_topic, range(400, 800),
                   PARTITIONS)
    stage.wait_committed(60)
    stage.assert_exactly_once()
    assert replica.terminate() == 0


def test_with_reset_latest_a_new_group_starts_at_the_end_of_the_input(stage: StageSetup) -> None:
    # The old stage read auto.offset.reset from its masked settings (never "latest")
    # and processed the whole history; sought to the end, it would then have sought
    # offset 0 on checking its first record.
    produce_inputs(stage.bootstrap, stage.input_topic, range(400), PARTITIONS)
    replica = stage.replica("a", TXSTAGE_CONSUMER__AUTO_OFFSET_RESET="latest")
    wait_for(replica.ready, 60, "every partition positioned", stage.logs)
    time.sleep(3)  # a seek librdkafka deferred (not fetching yet) finds the end then
    produce_inputs(stage.bootstrap, stage.input_topic, range(400, 600), PARTITIONS)
    stage.wait_committed(60)
    assert replica.terminate() == 0
    outputs = read_topic(stage.bootstrap, stage.output_topic)
    squares = sorted(int(record.value or b"0") for record in outputs)
    assert squares == sorted(value * value for value in range(400, 600)), \
        f"{len(squares)} outputs; the history's squares are below {400 * 400}"


def test_from_the_end_an_abort_before_the_first_commit_reads_its_records_again(
        stage: StageSetup, new_topic: Callable[..., str]) -> None:
    # The pair: auto.offset.reset=latest with nothing committed, and an abort inside
    # the first transaction (a refused output at offset 142 of every partition, one
    # 5 s transaction over offsets 50-149). The abort sends the partition back to the
    # offset committed in Kafka: none. Sought to the end again, the stage skipped
    # what it had read (100 records a partition, lost); it must go back to where it
    # started (offset 50), find the refused record and dead-letter it.
    compacted = compacted_topic(new_topic)
    produce_inputs(stage.bootstrap, stage.input_topic, range(400), PARTITIONS)
    replica = stage.replica(
        "a", TXSTAGE_CONSUMER__AUTO_OFFSET_RESET="latest", TEST_COMPACTED_TOPIC=compacted,
        TXSTAGE_TRANSFORM="tests.harness.transforms:square_with_refused_outputs",
        TXSTAGE_COMMIT_INTERVAL_MS="5000", TXSTAGE_COMMIT_MAX_RECORDS="1000000")
    wait_for(replica.ready, 60, "every partition positioned", stage.logs)
    time.sleep(3)  # a seek librdkafka deferred (not fetching yet) finds the end then
    produce_inputs(stage.bootstrap, stage.input_topic, range(400, 1200), PARTITIONS)
    stage.wait_committed(90)
    assert replica.terminate() == 0
    refused = {value for value in range(400, 1200) if (value // PARTITIONS) % 100 == 42}
    assert len(refused) == PARTITIONS
    squares = sorted(int(record.value or b"0") for record in
                     read_topic(stage.bootstrap, stage.output_topic))
    assert squares == sorted(v * v for v in range(400, 1200) if v not in refused), \
        f"{len(squares)} outputs of {800 - len(refused)}"
    assert len(read_topic(stage.bootstrap, stage.dlq_topic)) == len(refused)



@pytest.mark.parametrize("stage_on", ["classic"], indirect=True)  # (session: see below)
def test_a_seek_refused_past_the_fetch_stall_time_is_replaced_by_a_fresh_assignment(
        proxied_kafka: ProxiedKafka, stage_on: Callable[[KafkaService], StageSetup]) -> None:
    # CI (leader kill, classic protocol): librdkafka's committed-offset query for a new
    # assignment met a broker that had just stopped coordinating the group; it answered
    # NOT_COORDINATOR for the whole request, which librdkafka never retries
    # (librdkafka#5586). Every seek was refused for the rest of the run and the
    # partitions stayed paused, unfetched, where the fetch watch does not look. Here that
    # query is held at the proxy for longer than the test runs: the old stage processed
    # nothing until it was answered. The stage's own lookup answers; after
    # TXSTAGE_FETCH_STALL_S of refused seeks it assigns each partition afresh at the
    # committed offset. (Heartbeats wait behind the held query on the coordinator's
    # connection: the replica's session outlasts it, which only the classic protocol
    # lets a client choose.)
    stage = stage_on(proxied_kafka)
    proxy = proxied_kafka.proxy
    produce_inputs(proxied_kafka.direct_bootstrap, stage.input_topic, range(400), PARTITIONS)
    held = proxy.delay_request(Api.OFFSET_FETCH, 120.0, count=1,
                               client_id="txstage-*-consumer-*[0-9]")  # not its -offsets
    replica = stage.replica("a", TXSTAGE_FETCH_STALL_S="5",
                            TXSTAGE_CONSUMER__SESSION_TIMEOUT_MS="180000")
    try:
        wait_for(lambda: bool(proxy.applied_to(held)), 30, "librdkafka's offset query held",
                 stage.logs)
        stage.wait_committed(60)
        assert [record.released_at for record in proxy.applied_to(held)] == [None], \
            "processed only once librdkafka's own query was answered"
        assert replica.events("partition.reassigned")
    finally:
        proxy.clear(held)
    produce_inputs(proxied_kafka.direct_bootstrap, stage.input_topic, range(400, 600),
                   PARTITIONS)
    stage.wait_committed(60)
    stage.assert_exactly_once()
    assert replica.terminate() == 0
