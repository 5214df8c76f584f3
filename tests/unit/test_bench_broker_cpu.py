"""The benchmark's view of the broker: its CPU by thread group (the JIT apart from the
requests), and its JFR samples by what it was doing (``bench.broker_profile``)."""

from __future__ import annotations

import pytest

from bench.broker_profile import category, lines, summarise
from bench.common import broker_cpu_by_thread_group, cpu_by_thread_group


def test_the_jit_and_the_collector_are_told_apart_from_the_requests() -> None:
    before = {1: ("C2 CompilerThre", 10.0), 2: ("VM Thread", 1.0),
              3: ("data-plane-kafk", 5.0)}
    after = {1: ("C2 CompilerThre", 10.4), 2: ("VM Thread", 1.1),
             3: ("data-plane-kafk", 6.0), 4: ("C1 CompilerThre", 0.2)}  # a new thread
    spent = broker_cpu_by_thread_group(before, after, caused=1.9)
    assert spent["jit"] == pytest.approx(0.6)
    assert spent["gc"] == pytest.approx(0.1)
    assert spent["requests"] == pytest.approx(1.2)  # what the clients caused, less both


def test_requests_never_go_below_zero() -> None:
    spent = broker_cpu_by_thread_group({}, {1: ("C2 CompilerThre", 1.0)}, caused=0.5)
    assert spent["requests"] == 0.0


def test_a_sample_counts_for_the_api_its_request_handler_served() -> None:
    frames = ["ByteUtils.readUnsignedVarint", "LogValidator.validateBatch",
              "KafkaApis.handleProduceRequest", "KafkaApis.handle", "KafkaRequestHandler.run"]
    assert category(frames, "data-plane-kafka-request-handler-3") == "Produce"


def test_an_append_resumed_after_verification_counts_as_a_verified_produce() -> None:
    frames = ["LogSegment.append", "ReplicaManager.appendRecords",
              "ReplicaManager.postVerificationCallback$1", "KafkaRequestHandler.run"]
    assert category(frames, "data-plane-kafka-request-handler-0") == "Produce (verified)"


def test_other_samples_count_for_their_thread_without_its_number() -> None:
    assert category(["Selector.poll"], "data-plane-kafka-network-thread-0-PLAINTEXT-0") \
        == "network thread"
    assert category(["Foo.bar"], "TxnMarkerSenderThread") == "TxnMarkerSenderThread"
    assert category([], "group-coordinator-event-processor-1") \
        == "group-coordinator-event-processor"


def test_the_table_orders_categories_by_the_first_mode() -> None:
    counts = summarise([(["KafkaApis.handleEndTxnRequest"], "h"),
                        (["KafkaApis.handleProduceRequest"], "h"),
                        (["KafkaApis.handleProduceRequest"], "h")])
    assert counts == {"Produce": 2, "EndTxn": 1}
    table = lines({"exactly_once": {"EndTxn": 1.0, "Produce": 2.0},
                   "at_least_once": {"Produce": 4.0}})
    assert [row.split()[0] for row in table[1:]] == ["all", "Produce", "EndTxn"]
    assert table[1].split()[1:] == ["3.0", "4.0"]


def test_the_process_splits_into_its_loop_librdkafka_and_the_rest() -> None:
    before = {7: ("python", 1.0), 8: ("rdk:main", 0.5)}
    after = {7: ("python", 1.6), 8: ("rdk:main", 0.7), 9: ("rdk:broker1", 0.1),
             10: ("ThreadPool", 0.3)}
    spent = cpu_by_thread_group(7, before, after, total=1.2)
    assert spent["loop"] == pytest.approx(0.6)
    assert spent["librdkafka"] == pytest.approx(0.3)
    assert spent["other"] == pytest.approx(0.3)  # the total less both, ended threads too
