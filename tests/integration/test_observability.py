"""What an operator sees, scraped over real HTTP from a replica on a real broker.

Takes ≈ 86 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import confluent_kafka
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.reading import read_committed
from tests.harness.stage import (
    PARTITIONS,
    Replica,
    StageSetup,
    long_transactions,
    produce_inputs,
    samples,
    value,
    wait_for,
)

pytestmark = pytest.mark.kafka

README = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"  # the reference


def test_counters_match_what_was_sent_and_read(stage: StageSetup) -> None:
    replica = stage.replica("a")
    sent = produce_inputs(stage.bootstrap, stage.input_topic, range(5_000), PARTITIONS,
                          value=lambda i: b"bad" if i % 1000 == 1 else str(i).encode())
    stage.wait_committed(60)
    outputs = read_committed(stage.bootstrap, stage.output_topic)
    letters = read_committed(stage.bootstrap, stage.dlq_topic)
    scraped = samples(replica)

    def get(name: str, **labels: str) -> float:
        return scraped.get((name, tuple(sorted(labels.items()))), 0.0)

    assert get("txstage_records_consumed_total") == sent
    assert get("txstage_records_produced_total", topic=stage.output_topic) == len(outputs)
    assert get("txstage_records_produced_total", topic=stage.dlq_topic) == len(letters) == 5
    assert get("txstage_records_dead_lettered_total") == 5
    committed = get("txstage_transactions_committed_total")
    assert committed > 0
    assert get("txstage_transaction_commit_seconds_count") == committed
    for record in ("first", "last"):  # one observation each per committed transaction
        assert get("txstage_end_to_end_seconds_count", record=record) == committed
        # the inputs were produced just before: seconds, not a clock's epoch
        assert 0 < get("txstage_end_to_end_seconds_sum", record=record) / committed < 60
    assert get("txstage_records_per_transaction_count") == committed
    assert get("txstage_records_per_transaction_sum") == sent
    assert get("txstage_pinned_producers") == PARTITIONS
    assert get("txstage_rebalances_total", kind="assigned") >= 1
    assert get("txstage_producer_init_seconds_count") == PARTITIONS
    assert get("txstage_build_info", version="0.1.0", guarantee="exactly_once",
               group_id=stage.group_id, librdkafka=confluent_kafka.libversion()[0]) == 1
    wait_for(lambda: value(replica, "txstage_consumer_lag", topic=stage.input_topic,
                           partition="0") == 0, 10, "lag to read 0")
    assert replica.terminate() == 0


def test_the_cycle_collector_stays_out_of_the_way_of_the_records(stage: StageSetup) -> None:
    """service/observability/interpreter.py: once start-up is done, its objects are frozen and the
    youngest generation is collected every 20,000 allocations. With Python's defaults
    a replica ran ~5 young collections per 1,000 records (and a full one, walking every
    object start-up made, every ~100 of those); tuned, under one."""
    replica = stage.replica("a")
    wait_for(replica.ready, 30, "ready", stage.logs)
    before = samples(replica)
    sent = produce_inputs(stage.bootstrap, stage.input_topic, range(20_000), PARTITIONS)
    stage.wait_committed(60)
    after = samples(replica)

    def young_collections(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
        return scraped[("python_gc_collections_total", (("generation", "0"),))]

    young = young_collections(after) - young_collections(before)
    assert young < sent / 1000, f"{young:.0f} young collections over {sent} records"
    assert after[("process_cpu_seconds_total", ())] > before[("process_cpu_seconds_total", ())]
    assert replica.terminate() == 0


def test_readme_metrics_table_matches_what_is_served(stage: StageSetup) -> None:
    replica = stage.replica("a")
    wait_for(replica.ready, 30, "ready", stage.logs)
    served = {re.sub(r"_total$|_info$", "", family.name)
              for family in text_string_to_metric_families(replica.metrics())
              if family.name.startswith("txstage_")}
    table = README.read_text().split("<!-- metrics:start -->")[1].split("<!-- metrics:end -->")[0]
    documented = {re.sub(r"_total$|_info$", "", name)
                  for name in re.findall(r"^\| `(txstage_[a-z_]+)`", table, re.MULTILINE)}
    assert served == documented
    assert replica.terminate() == 0


def test_injected_abort_moves_the_abortable_error_reason(stage: StageSetup,
                                                         new_topic: object) -> None:
    compacted = new_topic(1, {"cleanup.policy": "compact"}, prefix="compact")  # type: ignore[operator]
    replica = stage.replica("a", TXSTAGE_TRANSFORM=(
        "tests.harness.transforms:square_with_broker_rejects"),
        TEST_COMPACTED_TOPIC=compacted, TXSTAGE_LOG_LEVEL="DEBUG")
    produce_inputs(stage.bootstrap, stage.input_topic, range(200), PARTITIONS)
    stage.wait_committed(60)
    # How many of the eight partitions' first-attempt refusals surface as separate
    # aborts depends on timing (seen: 3 to 8); that the reason moves is what matters.
    # (Once in a fresh-clone CI run no abort was counted at all and the log showed
    # nothing past start-up at info level; the debug log is kept to explain a repeat.)
    assert value(replica, "txstage_transactions_aborted_total",
                 reason="abortable_error") >= 1, replica.log_tail(200)
    assert value(replica, "txstage_transactions_aborted_total", reason="fenced") == 0
    assert value(replica, "txstage_kafka_errors_total", op="send_offsets_to_transaction",
                 action="abort") + value(replica, "txstage_kafka_errors_total",
                                         op="commit_transaction", action="abort") >= 1
    assert replica.terminate() == 0


def test_fence_moves_the_fenced_reason(stage: StageSetup) -> None:
    produce_inputs(stage.bootstrap, stage.input_topic, range(2_000), PARTITIONS)
    zombie = stage.replica("zombie", **long_transactions(delay_ms=2, commit_interval_ms=3000))
    wait_for(lambda: value(zombie, "txstage_oldest_open_transaction_seconds") > 0, 30,
             "an open transaction", stage.logs)
    heir = _taken_over_while_paused(stage, zombie)
    assert value(zombie, "txstage_transactions_aborted_total", reason="fenced") > 0
    assert value(heir, "txstage_producers_fenced_total") == 0
    assert heir.terminate() == 0


def test_a_fence_found_while_releasing_the_partitions_is_counted(stage: StageSetup) -> None:
    # The zombie has processed everything into transactions it never commits by itself
    # (a 90 s commit interval) when it is paused; its successor takes over. After
    # SIGCONT the zombie learns of it only when it gives its partitions up (lost: abort,
    # which the successor's init_transactions fenced). That fence was not counted.
    produce_inputs(stage.bootstrap, stage.input_topic, range(400), PARTITIONS)
    zombie = stage.replica("zombie", **long_transactions(delay_ms=1, commit_interval_ms=90_000),
                           TXSTAGE_TRANSACTION_TIMEOUT_MS="900000")
    wait_for(lambda: value(zombie, "txstage_records_consumed_total") >= 400, 30,
             "the zombie to process every input", stage.logs)
    heir = _taken_over_while_paused(stage, zombie)
    assert value(zombie, "txstage_transactions_aborted_total", reason="fenced") > 0
    assert [e for e in zombie.events("producer.fenced") if e.get("on") == "release"]
    assert heir.terminate() == 0


def _taken_over_while_paused(stage: StageSetup, zombie: Replica) -> Replica:
    """SIGSTOP ``zombie``, let an heir take its partitions and commit everything, then
    SIGCONT it and wait until it has counted a fence; the heir."""
    zombie.signal(signal.SIGSTOP)
    heir = stage.replica("heir")
    stage.wait_committed(60)
    zombie.signal(signal.SIGCONT)
    wait_for(lambda: value(zombie, "txstage_producers_fenced_total") > 0, 30,
             "the zombie to count its fence", stage.diagnose)
    return heir


def test_readyz_turns_ready_only_after_assignment(stage: StageSetup) -> None:
    replica = stage.replica("a", TXSTAGE_INPUT_TOPICS="placeholder")
    # No such input topic: the replica never gets past its checks, so never ready.
    replica.env["TXSTAGE_INPUT_TOPICS"] = stage.input_topic
    assert replica.proc is not None and replica.proc.wait(30) == 2
    replica.start()
    statuses = []
    wait_for(lambda: statuses.append(_status(replica)) or statuses[-1][0] == 200, 30, "ready",
             stage.logs)
    not_ready = [body for code, body in statuses if code == 503]
    assert all(body["status"] in {"not_joined", "awaiting_assignment",
                                  "initializing_producers"} for body in not_ready)
    ready = statuses[-1][1]
    assert ready["assigned"] == ready["ready"] == PARTITIONS
    assert replica.terminate() == 0


def _status(replica: Replica) -> tuple[int, dict[str, object]]:
    try:
        code, body = replica.get("/readyz")
    except OSError:
        return 0, {"status": "unreachable"}
    return code, json.loads(body)


def test_healthz_turns_unhealthy_when_the_loop_is_stuck(stage: StageSetup) -> None:
    replica = stage.replica("a", TXSTAGE_TRANSFORM="tests.harness.transforms:stuck_after",
                            TEST_STUCK_AT="5", TXSTAGE_HEALTH_STALE_AFTER_S="3")
    wait_for(replica.ready, 30, "ready", stage.logs)
    assert replica.get("/healthz")[0] == 200
    produce_inputs(stage.bootstrap, stage.input_topic, range(100), PARTITIONS)
    took = wait_for(lambda: replica.get("/healthz")[0] == 503, 15, "/healthz to fail")
    assert json.loads(replica.get("/healthz")[1])["status"] == "stale"
    assert took < 10


def test_logs_are_json_lines_bound_to_partition_and_transactional_id(stage: StageSetup) -> None:
    replica = stage.replica("a")
    produce_inputs(stage.bootstrap, stage.input_topic, range(50), PARTITIONS,
                   value=lambda i: b"bad" if i == 9 else str(i).encode())
    stage.wait_committed(60)
    assert replica.terminate() == 0
    lines = replica.log_path.read_text().splitlines()
    parsed = [json.loads(line) for line in lines]  # every line is JSON, or this raises
    assert all({"event", "level", "timestamp"} <= line.keys() for line in parsed)
    ready = [line for line in parsed if line["event"] == "producer.ready"]
    assert len(ready) == PARTITIONS
    assert all(line["transactional_id"] == f"{stage.group_id}.{stage.input_topic}."
               f"{line['partition']}" for line in ready)
    (letter,) = [line for line in parsed if line["event"] == "record.dead_lettered"]
    assert (letter["partition"], letter["offset"]) == (9 % PARTITIONS, 9 // PARTITIONS)
    assert not [line for line in parsed if line["level"] == "info"
                and "offset" in line and line["event"] != "record.dead_lettered"], \
        "no per-record lines at INFO"
