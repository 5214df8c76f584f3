"""A pinned producer fenced by a newer one with its transactional id, on a real broker:
every call after the fence must say *fenced* (close it, wait, reclaim), never a bare
fatal error (exit 1).

librdkafka tells a fatal error's cause once, in the event a poll serves; every later
call fails with a bare ``_FATAL``. The stage polls each pinned producer on its loop
(delivery reports), so that poll is usually the one that serves the fence. A chaos
campaign in CI (seed 13) saw a replica exit 1 that way: the poll dropped the cause and
the next produce was taken for fatal.

Takes ≈ 1 s (2 cores; make test, 2026-11-27)."""

from __future__ import annotations

import time

import pytest

from service.contract.processing import Produced
from service.errors import FencedError, KafkaOperationError
from service.kafka.producer import PinnedProducer
from tests.conftest import UniqueName
from tests.harness.admin import create_topic
from tests.harness.kafka import KafkaService

pytestmark = pytest.mark.kafka


def test_a_fence_served_by_the_loops_poll_is_named_by_the_next_produce(
        kafka: KafkaService, unique_name: UniqueName) -> None:
    source = create_topic(kafka.bootstrap, unique_name("fence-in"), partitions=1)
    output = create_topic(kafka.bootstrap, unique_name("fence-out"), partitions=2)
    config = {"bootstrap.servers": kafka.bootstrap, "log_level": 0,
              "transactional.id": unique_name("fence") + f".{source}.0"}
    older = PinnedProducer(config, source, 0, deadline_s=30)
    newer = PinnedProducer(config, source, 0, deadline_s=30)
    try:
        older.init()
        older.begin()
        older.produce_all([Produced(output, b"k", b"v", [])], 0)
        newer.init()  # the zombie's epoch is old now
        failed: KafkaOperationError | None = None
        deadline = time.monotonic() + 30
        partition = 1
        while failed is None and time.monotonic() < deadline:
            older.poll()  # as the loop does, every iteration
            time.sleep(0.05)
            try:  # a partition new to the transaction: AddPartitionsToTxn meets the fence
                older.produce(Produced(output, b"k", b"v", []), 1, partition=partition)
            except KafkaOperationError as exc:
                failed = exc
            partition = 1 - partition
        assert failed is not None, "the older producer never learnt it was fenced"
        assert isinstance(failed, FencedError), failed
        with pytest.raises(FencedError):  # and so does every later call
            older.produce(Produced(output, b"k", b"v", []), 2, partition=0)
    finally:
        older.close()
        newer.close()
