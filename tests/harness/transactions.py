"""A bare transactional producer with the product's settings, for tests of librdkafka's
coordinator handling (test_compound_faults, test_stage_cluster_faults): one commit
caches the group's coordinator, and a call that may never return runs on a thread."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from service.kafka.config import producer_config
from service.settings import load_settings


def product_config(bootstrap: str, inputs: str, group: str,
                   transactional_id: str) -> dict[str, Any]:
    """What the stage gives a pinned producer (the output topic plays no part in it);
    librdkafka's log goes to a quiet logger (a killed broker or a hung call is noisy)."""
    settings = load_settings({"TXSTAGE_BOOTSTRAP_SERVERS": bootstrap,
                              "TXSTAGE_INPUT_TOPICS": inputs, "TXSTAGE_GROUP_ID": group,
                              "TXSTAGE_OUTPUT_TOPIC": f"{inputs}-out",
                              "TXSTAGE_TRANSFORM": "service.examples.square:square"})
    config: dict[str, Any] = dict(producer_config(settings, transactional_id))
    config["logger"] = logging.getLogger("tests.transactions")
    return config


def committed_once(config: dict[str, Any], inputs: str, outputs: str,
                   group: str) -> tuple[Producer, Consumer, object]:
    """The producer after one transaction with offset 1 of ``inputs`` partition 0 for
    ``group``: librdkafka has cached the group's coordinator. Also the consumer whose
    group metadata it sent (close it) and that metadata."""
    producer = Producer(config)
    consumer = Consumer({"bootstrap.servers": config["bootstrap.servers"], "group.id": group})
    metadata = consumer.consumer_group_metadata()
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(outputs, b"before", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(inputs, 0, 1)], metadata, 30)
    producer.commit_transaction(30)
    return producer, consumer, metadata


class Trace(logging.Handler):
    """The last librdkafka debug lines about coordinators and transactions of one client,
    for a failure message: ``config.update(Trace().config())`` before the client exists."""

    FACILITIES = ("COORD", "TXNCOORD", "ADDOFFSETS", "TXNOFFSETCOMMIT", "APIRESULT", "ENDTXN",
                  "TXNSTATE", "TXNERR", "STATE", "FAIL", "NODENAME")

    def __init__(self, keep: int = 40) -> None:
        super().__init__(logging.DEBUG)
        self._lines: deque[str] = deque(maxlen=keep)
        self._logger = logging.getLogger(f"tests.transactions.trace.{id(self)}")
        self._logger.setLevel(logging.DEBUG)
        self._logger.propagate = False
        self._logger.addHandler(self)

    def config(self) -> dict[str, Any]:
        return {"debug": "eos,broker", "logger": self._logger}

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if line.startswith(self.FACILITIES):
            self._lines.append(f"{record.created:.3f} {line[:300]}")

    def tail(self) -> str:
        return "\n".join(self._lines)


class Call:
    """``call()`` on a daemon thread: librdkafka can leave a call blocked whatever its
    timeout, and a test must still end."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.outcome: str | None = None
        self._call = call
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._call()
            self.outcome = "returned"
        except Exception as exc:  # an error is an answer too
            self.outcome = f"failed: {exc}"

    def wait(self, timeout: float, *, serve: Callable[[float], object] | None = None
             ) -> str | None:
        """"returned", "failed: <error>", or None while it is still blocked. ``serve``
        (a client's ``poll``) runs every half second meanwhile: librdkafka hands its log
        lines over only there."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and (left := deadline - time.monotonic()) > 0:
            if serve is not None:
                serve(0)
            self._thread.join(min(left, 0.5))
        return self.outcome
