"""Kafka reads of fixed windows, streamed (no record is kept), read_committed: what
``txstage audit`` and ``txstage redrive`` read with.

Every function takes the librdkafka client properties (the stage's settings; the
credentials are the audit's own principal, docs/security.md) and raises KafkaException
on failure, PermissionError naming what the principal lacks. Except ``read_topics``:
whole topics into memory, from a bootstrap address alone, what the lineage check
(service.tools.verify), the backfill's parity and the tests read with.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec, TimestampSpec

from service.contract.records import Record
from service.errors import RetriableError, UnfinishedError, Where
from service.kafka.config import FETCH_QUEUE_BACKOFF_MS
from service.kafka.errors import kafka_error
from service.kafka.messages import to_record
from service.kafka.retry import retry_until
from service.observability.logs import librdkafka_logger

Partition = tuple[str, int]
Config = Mapping[str, Any]
EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]


_DENIED = {KafkaError.TOPIC_AUTHORIZATION_FAILED: "READ on topic",
           KafkaError.GROUP_AUTHORIZATION_FAILED: "DESCRIBE on group"}


def partitions(config: Config, topics: Iterable[str]) -> list[Partition]:
    """Every partition of ``topics``; LookupError names a topic that does not exist."""
    admin = AdminClient(_with_logger(config))
    found: list[Partition] = []
    for topic in topics:
        # One topic at a time: a listing of all topics leaves out, silently, those this
        # principal may not describe; asked by name, the broker says it is denied.
        described = admin.list_topics(topic, timeout=15).topics.get(topic)
        error = None if described is None else described.error
        if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise PermissionError(f"missing permission: READ on topic `{topic}`")
        if described is None or error is not None:
            raise LookupError(f"topic {topic!r} does not exist")
        found += [(topic, p) for p in sorted(described.partitions)]
    return found


def _denied(exc: KafkaException, name: str) -> Exception:
    error = kafka_error(exc)
    if error is not None and error.code() in _DENIED:
        return PermissionError(f"missing permission: {_DENIED[error.code()]} `{name}`")
    return exc


# ListOffsets answers while a partition's leader is still being chosen or reached.
_MOVING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
           KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT, KafkaError._TIMED_OUT}


def list_offsets(config: Config, wanted: Iterable[Partition], spec: OffsetSpec,
                 isolation: IsolationLevel = IsolationLevel.READ_COMMITTED, *,
                 timeout_s: float = 30.0) -> dict[Partition, int]:
    """``spec`` offsets: latest + READ_COMMITTED is the last stable offset, latest +
    READ_UNCOMMITTED the high watermark."""
    admin = AdminClient(_with_logger(config))  # kept until the results are in: they die with it
    return offsets(admin, wanted, spec, isolation, timeout_s=timeout_s)


def offsets(admin: AdminClient, wanted: Iterable[Partition], spec: OffsetSpec,
            isolation: IsolationLevel, *, timeout_s: float) -> dict[Partition, int]:
    """One ListOffsets for every partition, asked again until ``timeout_s`` while a
    partition is not answered for: its leader is moving (an error), or librdkafka
    gives no offset and no error (-1001: seen for the partitions of a killed leader,
    before the new one is known). Only a timestamp may have no offset (-1)."""
    request = {TopicPartition(t, p): spec for t, p in wanted}
    if not request:
        return {}
    by_time = isinstance(spec, TimestampSpec)

    def ask() -> dict[Partition, int]:
        futures = admin.list_offsets(request, isolation_level=isolation,
                                     request_timeout=timeout_s)
        try:
            found = {(tp.topic, tp.partition): int(f.result(timeout_s + 5).offset)
                     for tp, f in futures.items()}
        except KafkaException as exc:
            error = kafka_error(exc)
            if error is not None and (error.retriable() or error.code() in _MOVING):
                raise RetriableError(Where("list_offsets"), error) from exc
            raise
        unanswered = sorted(k for k, offset in found.items()
                            if offset == OFFSET_INVALID or (offset < 0 and not by_time))
        if unanswered:
            topic, partition = unanswered[0]
            raise RetriableError(
                Where("list_offsets", topic=topic, partition=partition),
                KafkaError(KafkaError.LEADER_NOT_AVAILABLE,
                           f"no offset answered for {len(unanswered)} partition(s)"))
        return found

    try:
        return retry_until(time.monotonic() + timeout_s, ask, pause=0.2)
    except RetriableError as exc:  # this module's callers get librdkafka's own error
        raise KafkaException(exc.error) from exc


def offsets_for_time(config: Config, wanted: Iterable[Partition], ms: int
                     ) -> dict[Partition, int]:
    """The first offset at or after timestamp ``ms`` (the end offset if none)."""
    found = list_offsets(config, wanted, OffsetSpec.for_timestamp(ms))
    ends = list_offsets(config, [k for k, v in found.items() if v < 0], LATEST)
    return {k: (ends[k] if v < 0 else v) for k, v in found.items()}


_UNSTABLE_RETRY_S = 0.1  # between asks while a transaction holds a partition's offsets


def group_reader(config: Config, group_id: str, *, stable: bool = True) -> Consumer:
    """A consumer of the group that never joins it: it only asks for committed offsets.
    ``stable`` (read_committed) sends RequireStable, so an offset an open transaction
    holds is answered UNSTABLE_OFFSET_COMMIT, never stale.

    Not the AdminClient: librdkafka answers NOT_COORDINATOR to an admin
    ListConsumerGroupOffsets by poking a consumer group the admin client does not
    have, and the process dies with SIGSEGV (librdkafka#5040) when the group
    coordinator moves (a broker restarts or pauses)."""
    return Consumer({**config, "logger": librdkafka_logger("offsets"),
                     "group.id": group_id, "enable.auto.commit": False,
                     "isolation.level": "read_committed" if stable else "read_uncommitted"})


def committed(config: Config, group_id: str, wanted: Iterable[Partition], *,
              timeout_s: float = 60.0) -> dict[Partition, int]:
    """The group's committed offsets (stable ones); -1001 where none. A partition whose
    offsets an open transaction holds is asked again (a running exactly-once stage has
    one open most of the time) until ``timeout_s``. PermissionError names a group this
    principal may not describe."""
    _may_describe(config, group_id)
    with OffsetReader(config, group_id) as reader:
        return reader.committed(wanted, timeout_s=timeout_s)


class OffsetReader:
    """Committed and end offsets, asked as often as needed through clients kept open:
    the one way the tools, the lineage check, the tests and the benchmarks read them.

    Committed offsets come through :func:`group_reader` (never the AdminClient,
    librdkafka#5040); ``stable`` asks with RequireStable, so an offset an open
    transaction holds is asked again, never answered stale. End offsets come from one
    ListOffsets request for all partitions."""

    def __init__(self, config: Config, group_id: str | None = None, *,
                 stable: bool = True) -> None:
        self._admin = AdminClient(_with_logger(config))
        self._group_id = group_id or ""
        self._consumer = None if group_id is None else group_reader(config, group_id,
                                                                    stable=stable)

    def committed(self, wanted: Iterable[Partition], *,
                  timeout_s: float = 60.0) -> dict[Partition, int]:
        """The group's committed offsets; negative where none."""
        assert self._consumer is not None, "no group given"
        deadline = time.monotonic() + timeout_s
        found: dict[Partition, int] = {}
        pending = list(wanted)
        while pending:
            unstable = []
            for key, (offset, error) in _committed(self._consumer, self._group_id, pending,
                                                   deadline).items():
                if error is None:
                    found[key] = offset
                elif error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT and \
                        time.monotonic() < deadline:
                    unstable.append(key)
                else:
                    raise _denied(KafkaException(error), self._group_id)
            pending = unstable
            if pending:
                time.sleep(_UNSTABLE_RETRY_S)
        return found

    def end_offsets(self, wanted: Iterable[Partition], *, stable: bool = False,
                    timeout_s: float = 10.0) -> dict[Partition, int]:
        """High watermarks, or with ``stable`` the last stable offsets; a partition not
        answered for (its leader moving in) is asked again until ``timeout_s``."""
        isolation = IsolationLevel.READ_COMMITTED if stable else IsolationLevel.READ_UNCOMMITTED
        return offsets(self._admin, wanted, LATEST, isolation, timeout_s=timeout_s)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()

    def __enter__(self) -> OffsetReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _may_describe(config: Config, group_id: str) -> None:
    """PermissionError unless this principal may DESCRIBE the group. Asked first: a
    consumer denied the group's coordinator only times out (librdkafka queues the
    denial as a consume() event), where DescribeConsumerGroups says why at once."""
    admin = AdminClient(_with_logger(config))  # kept until the result is in
    [future] = admin.describe_consumer_groups([group_id], request_timeout=30).values()
    try:
        future.result(35)
    except KafkaException as exc:
        error = kafka_error(exc)
        if error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            raise _denied(exc, group_id) from exc


def _committed(consumer: Consumer, group_id: str, wanted: list[Partition], deadline: float
               ) -> dict[Partition, tuple[int, KafkaError | None]]:
    timeout = max(1.0, deadline - time.monotonic())
    try:
        answer = consumer.committed([TopicPartition(t, p) for t, p in wanted], timeout=timeout)
    except KafkaException as exc:
        error = kafka_error(exc)
        if error is not None and error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT:
            return {key: (-1, error) for key in wanted}
        raise _denied(exc, group_id) from exc
    return {(tp.topic, tp.partition): (tp.offset, tp.error) for tp in answer}


def read(config: Config, group_id: str, windows: Mapping[Partition, tuple[int, int]],
         on_message: Callable[[Message], None], *, timeout_s: float) -> int:
    """Call ``on_message`` for every record of each partition's ``[start, end)``, read
    read_committed; returns how many. A partition is done once a record at or past
    ``end - 1`` arrived or the read reached its end; TimeoutError names those that did
    not within ``timeout_s`` (a hanging transaction below ``end``).

    ``group_id`` names the consumer (the Python client wants one); it never joins or
    commits, and needs no ACL on that group (tested without one)."""
    todo = {k: (s, e) for k, (s, e) in windows.items() if e > s}
    if not todo:
        return 0
    consumer = Consumer({"logger": librdkafka_logger("reader"),
                         "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
                         **config, "group.id": group_id, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    count = 0
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(t, p, s) for (t, p), (s, _) in todo.items()])
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError("read_committed did not reach the end of "
                                   + ", ".join(f"{t}/{p} ({e})" for (t, p), (_, e) in todo.items()))
            done: list[Partition] = []
            for msg in consumer.consume(10_000, 0.5):
                key = (str(msg.topic()), int(msg.partition() or 0))
                window = todo.get(key)
                if window is None:
                    continue
                offset = int(msg.offset() or 0)
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and offset >= window[1]:
                        done.append(key)
                    elif error.code() in _DENIED:
                        raise PermissionError(f"missing permission: {_DENIED[error.code()]} "
                                              f"`{key[0]}`")
                    elif error.code() != KafkaError._PARTITION_EOF:
                        raise UnfinishedError(f"reading {key[0]}/{key[1]}: {error.str()}")
                    continue
                if offset < window[1]:
                    on_message(msg)
                    count += 1
                if offset >= window[1] - 1:
                    done.append(key)
            for key in done:
                if todo.pop(key, None) is not None:
                    consumer.pause([TopicPartition(*key)])
    finally:
        consumer.close()
    return count


class HangingTransactionError(TimeoutError):
    """read_committed could not reach the end of a partition: a transaction is open (V5 of
    service.tools.verify)."""


def read_topics(bootstrap: str, topics: Iterable[str], *, isolation: str = "read_committed",
                timeout_s: float = 60.0) -> list[Record]:
    """Every record of ``topics`` from the beginning to the end, in partition order.

    Raises HangingTransactionError if read_committed cannot reach a partition's
    high watermark within ``timeout_s``.
    """
    consumer = Consumer({
        "logger": librdkafka_logger("verify"),
        "bootstrap.servers": bootstrap, "group.id": f"txstage-verify-{uuid.uuid4().hex}",
        "isolation.level": isolation, "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest",
        # Watermark queries queue behind an in-flight fetch: keep fetches short.
        "fetch.wait.max.ms": 10,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    })
    try:
        return _read_to_end(consumer, topic_partitions(consumer, topics), timeout_s)
    finally:
        consumer.close()


def topic_partitions(consumer: Consumer, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` at offset 0, as ``consumer`` is told of them;
    LookupError names a topic that does not exist."""
    metadata = consumer.list_topics(timeout=15)
    found = []
    for topic in topics:
        if topic not in metadata.topics:
            raise LookupError(f"topic {topic!r} does not exist")
        found += [TopicPartition(topic, p, 0) for p in metadata.topics[topic].partitions]
    return found


def _read_to_end(consumer: Consumer, partitions: list[TopicPartition],
                 timeout_s: float) -> list[Record]:
    consumer.assign(partitions)
    records: list[Record] = []
    reached: dict[Partition, int] = {}
    deadline = time.monotonic() + timeout_s
    wanted = {(tp.topic, tp.partition) for tp in partitions}
    while True:
        # Watermarks cost a round trip each: ask only once every partition hit its end.
        if wanted <= reached.keys() or time.monotonic() > deadline:
            high = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10)[1]
                    for tp in partitions}
            if all(reached.get(k, 0 if h == 0 else -1) >= h for k, h in high.items()):
                return records
        if time.monotonic() > deadline:
            behind = {f"{t}/{p}": (reached.get((t, p)), h) for (t, p), h in high.items()
                      if reached.get((t, p), -1) < h}
            raise HangingTransactionError(f"read_committed stuck below the high watermark "
                                          f"(reached, high): {behind}")
        for msg in consumer.consume(10_000, 0.2):
            error = msg.error()
            key = (str(msg.topic()), int(msg.partition() or 0))
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                reached[key] = int(msg.offset() or 0)
            elif error is None:
                records.append(to_record(msg))


def _with_logger(config: Config) -> dict[str, Any]:
    """librdkafka's log through the stage's logger, never raw to stderr."""
    return {**config, "logger": librdkafka_logger("reader")}
