"""The exactly-once committer's own work on the loop thread, without a broker: its
pinned producers' clients are real librdkafka producers pointed at a closed port."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from service.contract.processing import Produced
from service.kafka.producer import PinnedProducer
from service.observability.metrics import Metrics
from service.settings import load_settings
from service.stage.guarantees.exactly_once import ExactlyOnce

NOWHERE = "127.0.0.1:1"


def committer_with_one_producer() -> tuple[ExactlyOnce, PinnedProducer]:
    settings = load_settings({
        "TXSTAGE_BOOTSTRAP_SERVERS": NOWHERE, "TXSTAGE_GROUP_ID": "g",
        "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
        "TXSTAGE_TRANSFORM": "service.examples.square:square"})
    committer = ExactlyOnce(settings, Metrics(CollectorRegistry()))
    pinned = PinnedProducer({"bootstrap.servers": NOWHERE, "transactional.id": "g.in.0"},
                            "in", 0, deadline_s=1)
    pinned.close()  # its transactional client is replaced by a plain one: no broker here
    pinned.closed = False
    pinned._producer = Producer({"bootstrap.servers": NOWHERE, "log_level": 0,
                                 "message.timeout.ms": 10, "delivery.report.only.error": True})
    pinned.in_transaction = True
    committer._producers[("in", 0)] = pinned
    return committer, pinned


def test_delivery_reports_are_served_by_the_loop_not_left_to_the_commit() -> None:
    # confluent-kafka takes the GIL for each delivery report. Served inside
    # commit_transaction, on a job thread, each one waited for the busy loop thread.
    committer, pinned = committer_with_one_producer()
    committer.write(("in", 0), 41, [Produced("out", b"k", b"v", [])])
    deadline = time.monotonic() + 10
    failures: tuple[object, ...] = ()
    while not failures and time.monotonic() < deadline:
        time.sleep(0.05)
        assert committer.poll(time.monotonic()) == []  # what failed surfaces at the commit
        failures = pinned.deliveries.take()
    assert [f.offset for f in failures] == [41]  # type: ignore[attr-defined]


def test_a_closed_producer_is_not_polled() -> None:
    committer, pinned = committer_with_one_producer()
    pinned.close()
    assert committer.poll(time.monotonic()) == []  # its client is gone: polling would fail
