"""When a broker is ready: it lists the expected nodes and serves transactions and groups."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from service.local_kafka.errors import LocalKafkaError


def listed_brokers(bootstrap: str, timeout: float) -> set[int]:
    """The ids the cluster's metadata lists (live, unfenced brokers).

    Metadata, not DescribeCluster (which librdkafka builds from the same answer):
    librdkafka 2.16 aborts the whole process (``rdkafka_admin.c:960:
    rd_kafka_admin_response_parse: Assertion `rko_result' failed``) when a
    DescribeCluster answer lists no broker. A single node answers so for a moment
    after SIGCONT, while it is fenced: the metadata parser returns ``_PARTIAL`` ("No
    brokers or topics in metadata"), the DescribeCluster parser returns the buffer's
    error (none) and no result, so ``heal()`` would abort the test run. The metadata
    API reports the same ``_PARTIAL`` as an error (a KafkaException)
    (docs/journal/2026-11-27-seed-11-test-in-ci.md)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    return set(admin.list_topics(timeout=timeout).brokers)


def wait_ready(
    bootstrap: str,
    *,
    broker_ids: set[int] | None = None,
    timeout: float = 60.0,
    probe_id: str | None = None,
) -> None:
    """Until the cluster lists ``broker_ids`` and serves transactions and consumer groups.

    Serving transactions means ``init_transactions`` succeeds (the ``__transaction_state``
    topic exists and its coordinator is loaded), and groups that an OffsetFetch answers
    (``__consumer_offsets`` likewise). Raises :class:`TimeoutError` with the last error.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"Kafka at {bootstrap} not ready: {last_error!r}")
        return left

    while broker_ids is not None:
        left = remaining()  # outside the try: its TimeoutError ends the wait
        try:
            seen = listed_brokers(bootstrap, min(5.0, left))
            if broker_ids <= seen:
                break
            last_error = LocalKafkaError(f"brokers {sorted(seen)}, want {sorted(broker_ids)}")
        except KafkaException as exc:  # the metadata API's time-out is one too
            last_error = exc
        time.sleep(0.2)
    transactional_id = probe_id or f"txstage-local-kafka-probe-{uuid.uuid4().hex[:8]}"
    quiet = {"bootstrap.servers": bootstrap, "log_level": 0}  # errors are expected here

    def transactions() -> None:
        nonlocal last_error
        while True:
            producer = Producer({**quiet, "transactional.id": transactional_id})
            try:
                producer.init_transactions(min(10.0, remaining()))
                return
            except KafkaException as exc:
                last_error = exc
                time.sleep(0.1)
            finally:
                with contextlib.suppress(KafkaException):
                    producer.close()

    def groups() -> None:
        nonlocal last_error
        consumer = Consumer(
            {
                **quiet,
                "group.id": f"{transactional_id}-group",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        try:
            while True:
                try:
                    probe = [TopicPartition("__txstage_probe", 0)]
                    consumer.committed(probe, min(10.0, remaining()))
                    return
                except KafkaException as exc:
                    last_error = exc
                    time.sleep(0.1)
        finally:
            consumer.close()

    # Both create and load an internal topic (50 partitions each): in parallel.
    run_parallel([transactions, groups])



def run_parallel(tasks: Sequence[Callable[[], None]]) -> None:
    """Run callables in threads; re-raise the first error."""
    errors: list[BaseException] = []

    def run(task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
