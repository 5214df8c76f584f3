"""Where a transform call that overran TXSTAGE_TRANSFORM_TIMEOUT_MS is remembered for
the partition's next owner: the compacted topic ``<transactional id prefix>.txstage.overruns``,
one record per input partition (key ``<topic>/<partition>``, value
``{"offset", "overruns", "timeout_ms"}``).

Written only when a call overran (stage/transform_watch.py), with a plain idempotent
producer, acks=all, before the replica leaves its group: the next owner is assigned
the partition after that, so a read it begins after its assignment sees the record.
Read beside the loop, by the committed-offset lookup (stage/positions.py); one read
serves every partition assigned before it began.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import structlog
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from service.error_codes import DENIALS
from service.errors import Where
from service.kafka import reading
from service.kafka.errors import translated
from service.kafka.topics import create_topic
from service.observability.logs import librdkafka_logger
from service.stage.machine import Overrun

log = structlog.get_logger(__name__)

Config = Mapping[str, Any]
_IO_TIMEOUT_S = 10.0  # each step of a read or a write: the fault path must end


def overruns_topic(prefix: str) -> str:
    return f"{prefix}.txstage.overruns"


def key_of(topic: str, partition: int) -> bytes:
    return f"{topic}/{partition}".encode()


def encode(overrun: Overrun) -> bytes:
    return json.dumps({"offset": overrun.offset, "overruns": overrun.count,
                       "timeout_ms": overrun.timeout_ms}).encode()


def partition_of(key: bytes | None) -> tuple[str, int] | None:
    topic, _, number = (key or b"").decode(errors="replace").rpartition("/")
    return (topic, int(number)) if topic and number.isdigit() else None


def decode(value: bytes | None) -> Overrun | None:
    """None for a record that is not an overrun (a tombstone, a stranger's bytes): a bad
    record must not keep a partition from being positioned."""
    try:
        found = json.loads(value or b"")
        return Overrun(int(found["offset"]), int(found["overruns"]),
                       int(found.get("timeout_ms", 0)))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class OverrunBook:
    """The overruns topic, as one replica reads and writes it. Thread-safe: the lookup
    jobs read it, the transform watch writes it."""

    def __init__(self, prefix: str, admin_config: Config, producer_config: Config) -> None:
        self.topic = overruns_topic(prefix)
        # A metadata request by name must not create the topic with the broker's
        # defaults (not compacted): an admin client is a producer to librdkafka.
        self._admin: dict[str, Any] = {**admin_config, "allow.auto.create.topics": False}
        self._producer = producer_config
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int], Overrun] = {}
        self._read_began = float("-inf")

    def entry(self, topic: str, partition: int, since: float) -> Overrun | None:
        """The partition's overrun, from a read begun at or after ``since`` (its
        assignment). Never raises: a read that fails is logged and the partition is
        positioned as if nothing was recorded (a hang then costs one more overrun)."""
        with self._lock:
            if self._read_began < since:
                began = time.monotonic()
                try:
                    self._entries = self._read()
                except Exception as exc:  # reading raises PermissionError naming the ACL
                    log.warning("overruns.read_failed", topic=self.topic, error=str(exc),
                                note="positioned as if no transform call had overrun")
                self._read_began = began  # failed too: not once more per partition
            return self._entries.get((topic, partition))

    def _read(self) -> dict[tuple[str, int], Overrun]:
        try:
            parts = reading.partitions(self._admin, [self.topic])
        except LookupError:
            return {}  # no call ever overran: the usual case
        start = reading.list_offsets(self._admin, parts, reading.EARLIEST,
                                     timeout_s=_IO_TIMEOUT_S)
        end = reading.list_offsets(self._admin, parts, reading.LATEST, timeout_s=_IO_TIMEOUT_S)
        found: dict[tuple[str, int], Overrun] = {}

        def keep(msg: Message) -> None:
            key, overrun = partition_of(msg.key()), decode(msg.value())
            if key is not None and overrun is not None:
                found[key] = overrun
            elif key is not None:  # a tombstone (an operator's): forgotten
                found.pop(key, None)

        reading.read(self._admin, self.topic, {k: (start[k], end[k]) for k in parts}, keep,
                     timeout_s=_IO_TIMEOUT_S)
        return found

    def record(self, topic: str, partition: int, offset: int, timeout_ms: int) -> Overrun:
        """Count one more overrun of the record at ``offset`` (the first, unless the
        entry this replica read names the same offset) and write it, acks=all: on
        return it is where the next owner reads. Creates the topic on first use.
        Raises on failure; a missing permission is a DeniedError naming it."""
        with self._lock:
            known = self._entries.get((topic, partition))
        count = known.count + 1 if known is not None and known.offset == offset else 1
        overrun = Overrun(offset, count, timeout_ms)
        config: dict[str, Any] = {**self._admin, "logger": librdkafka_logger("admin")}
        admin = AdminClient(config)
        create_topic(admin, self.topic, partitions=1, config={"cleanup.policy": "compact"},
                     timeout_s=_IO_TIMEOUT_S)
        failed: list[KafkaError] = []

        def delivered(error: KafkaError | None, _msg: Message) -> None:
            if error is not None:
                failed.append(error)

        producer = Producer({**self._producer, "logger": librdkafka_logger("overruns")})
        where = Where("produce", topic=self.topic)
        with translated(where):
            producer.produce(self.topic, encode(overrun), key_of(topic, partition),
                             on_delivery=delivered)
            left = producer.flush(_IO_TIMEOUT_S)
        if failed and failed[0].code() in DENIALS:
            raise PermissionError(f"missing permission: WRITE on topic `{self.topic}`")
        if failed:
            raise RuntimeError(f"{self.topic}: {failed[0].str()}")
        if left:
            raise TimeoutError(f"{self.topic}: not delivered in {_IO_TIMEOUT_S:.0f} s")
        with self._lock:
            self._entries[(topic, partition)] = overrun
        return overrun

