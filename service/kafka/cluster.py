"""Cluster facts the stage checks before and while it runs: topics, their limits,
the broker's transaction time-out ceiling. All AdminClient use lives here."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._listoffsets import OffsetSpec

from service.contract.processing import TopicLimitPending
from service.error_codes import DENIALS
from service.errors import (
    DeniedError,
    KafkaOperationError,
    RetriableError,
    Where,
)
from service.kafka.config import Config
from service.kafka.errors import translate
from service.kafka.reading import group_reader
from service.kafka.retry import retry_until
from service.observability.logs import librdkafka_logger

_TIMEOUT_S = 15.0
_RESOLVE_PAUSE_S = 0.5  # between OutputLimits.resolve's attempts
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's producer default
_LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]


# Admin answers that say "not now" rather than "no": the cluster is moving, slow or down.
_TRANSIENT = frozenset({
    KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.UNSTABLE_OFFSET_COMMIT,
})


def _translated(exc: KafkaException, where: Where) -> KafkaOperationError:
    error = translate(exc, where)
    if error.code in _TRANSIENT and not isinstance(error, RetriableError):
        return RetriableError(where, error.error)
    return error


def _no_answer(where: Where) -> RetriableError:
    """The cluster's failure to answer in time ("not now"), never a denial."""
    return RetriableError(where, KafkaError(
        KafkaError._TIMED_OUT, f"no answer within {_TIMEOUT_S} s", retriable=True))


# Authorized operations the broker did not report (an old broker): checked at use.
UNSAID = frozenset({"UNSAID"})


def _names(operations: object) -> frozenset[str]:
    """AclOperation values as their names (UNSAID: the broker did not say)."""
    if not isinstance(operations, (list, tuple, set, frozenset)):
        return UNSAID
    return frozenset(getattr(op, "name", str(op)) for op in operations)


class UnknownTopicError(LookupError):
    """A transform routed an output to a topic that does not exist."""


class Cluster:
    """A thin, cached view of the cluster through one AdminClient (and, for committed
    offsets, consumers that never join their group). The cache matters:
    the start-up checks describe the output and dead-letter topics, so the running
    stage never needs the admin API for them (during a broker failure it may hang)."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._denial: KafkaError | None = None
        self._authenticated = False
        self._admin = self._new_admin()
        self._lock = threading.Lock()
        self._offset_readers: dict[tuple[str, bool], Consumer] = {}
        self._topic_configs: dict[str, dict[str, str]] = {}

    def _new_admin(self) -> AdminClient:
        with_callback: Config = {**self._config, "error_cb": self._on_error,
                                 "logger": librdkafka_logger("admin")}
        return AdminClient(with_callback)

    def renew(self) -> None:
        """Ask through a new AdminClient from now on. For a caller that waits out a
        cluster that did not answer: nothing the outage left in the old client's
        state outlives it. Otherwise a client begun while the only broker is paused
        can go on failing with "Failed while waiting for controller" for 80 s after
        the broker serves again (librdkafka 2.16;
        docs/journal/2026-11-27-seed-11-test-in-ci.md)."""
        self._admin = self._new_admin()
        self._authenticated = False
        self._denial = None

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in DENIALS:  # a wrong password: requests time out, this says why
            self._denial = error

    def _authenticate(self) -> None:
        """Until the cluster answers metadata. A refused login is known from error_cb
        within a second, while a request waits out its whole time-out: ask in short
        steps, so that a wrong password is an answer at once, not 15 s later."""
        if self._authenticated:
            return
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                self._admin.list_topics(timeout=0.5)
            except KafkaException as exc:
                denied = self.denial()
                if denied is not None:
                    raise denied from exc
                if time.monotonic() >= deadline:
                    raise _translated(exc, Where("list_topics")) from exc
                continue
            self._authenticated = True
            return

    def denial(self) -> DeniedError | None:
        """The broker refused this client's credentials (seen through error_cb)."""
        self._admin.poll(0)  # serves error_cb
        if self._denial is None:
            return None
        return DeniedError(Where("connect"), self._denial)

    def topic_operations(self, topics: Sequence[str]) -> dict[str, frozenset[str] | None]:
        """``topic -> the ACL operations this principal may perform on it`` (``READ``,
        ``WRITE``, ...; empty: not even DESCRIBE), ``None`` for a topic that does not
        exist. Kafka answers a topic one may not describe as unauthorized whether or
        not it exists, so as not to tell."""
        self._authenticate()
        futures = self._admin.describe_topics(
            TopicCollection(list(topics)), request_timeout=_TIMEOUT_S,
            include_authorized_operations=True)
        found: dict[str, frozenset[str] | None] = {}
        for topic, future in futures.items():
            where = Where("describe_topics", topic=topic)
            try:
                description = future.result(timeout=_TIMEOUT_S + 1)
            except TimeoutError as exc:
                raise _no_answer(where) from exc
            except KafkaException as exc:
                found[topic] = self._operations_denied(exc, where)
                continue
            found[topic] = _names(description.authorized_operations)
        return found

    def group_operations(self, group_id: str) -> frozenset[str]:
        """The ACL operations this principal may perform on the consumer group (empty:
        not even DESCRIBE). A group nobody joined yet is described too."""
        [future] = self._admin.describe_consumer_groups(
            [group_id], request_timeout=_TIMEOUT_S,
            include_authorized_operations=True).values()
        where = Where("describe_consumer_groups")
        try:
            description = future.result(timeout=_TIMEOUT_S + 1)
        except TimeoutError as exc:
            raise _no_answer(where) from exc
        except KafkaException as exc:
            return self._operations_denied(exc, where) or frozenset()
        return _names(description.authorized_operations)

    @staticmethod
    def _operations_denied(exc: KafkaException, where: Where) -> frozenset[str] | None:
        error = _translated(exc, where)
        if error.code in DENIALS:
            return frozenset()
        if error.code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise error from exc

    @staticmethod
    def transactions_allowed(producer_config: Config) -> bool:
        """Whether ``init_transactions`` of ``producer_config``'s transactional id is
        allowed (WRITE on it). The id gets a producer id and an empty transaction state,
        which Kafka expires after ``transactional.id.expiration.ms`` (7 days)."""
        where = Where("init_transactions", producer_config.get("transactional.id"))
        # Nothing is produced, so nothing to flush: a flush would only raise the
        # producer's fatal error again.
        producer = Producer({**producer_config, "logger": librdkafka_logger("check")})
        try:
            producer.init_transactions(_TIMEOUT_S)
        except KafkaException as exc:
            error = _translated(exc, where)
            if error.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                return False
            # The broker checks the transaction time-out only once the id is authorized;
            # a time-out above its ceiling is a problem of its own (the checks name it).
            if error.code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                return True
            raise error from exc
        return True

    def committed_offset(self, group_id: str, topic: str, partition: int, *,
                         require_stable: bool = True, timeout_s: float = _TIMEOUT_S) -> int:
        """The group's committed offset of one partition (< 0: none), asked with
        RequireStable: while a transaction holding offsets for it is still open the
        broker answers UNSTABLE_OFFSET_COMMIT (retriable) instead of a stale offset.

        Asked through :func:`reading.group_reader` (one per group and isolation level;
        never the AdminClient, librdkafka#5040). Not the stage's own consumer: its
        committed() from a second thread waits while its loop thread sits in consume()."""
        where = Where("committed", topic=topic, partition=partition)
        consumer = self._offset_reader(group_id, require_stable)
        try:
            [found] = consumer.committed([TopicPartition(topic, partition)], timeout=timeout_s)
        except KafkaException as exc:
            error = _translated(exc, where)
            if error.code == KafkaError._TIMED_OUT:
                self._renew_offset_reader(group_id, require_stable, consumer)
            raise error from exc
        if found.error is not None:
            raise _translated(KafkaException(found.error), where)
        return int(found.offset)

    def _offset_reader(self, group_id: str, stable: bool) -> Consumer:
        with self._lock:
            reader = self._offset_readers.get((group_id, stable))
            if reader is None:
                name = f"{self._config.get('client.id', 'txstage')}-offsets"
                reader = self._offset_readers[(group_id, stable)] = group_reader(
                    {**self._config, "client.id": name}, group_id, stable=stable)
            return reader

    def _renew_offset_reader(self, group_id: str, stable: bool, stale: Consumer) -> None:
        """A fresh client after a time-out: after a broker restart an old client can
        time out every group-offset request while new clients get answers. (The
        stale one is never closed here: another thread may be inside it. It goes
        when the last call on it returns.)"""
        with self._lock:
            if self._offset_readers.get((group_id, stable)) is stale:
                del self._offset_readers[(group_id, stable)]

    def high_watermarks(self, keys: Sequence[tuple[str, int]], *,
                        timeout_s: float = _TIMEOUT_S) -> dict[tuple[str, int], int]:
        """Each partition's high watermark (ListOffsets, latest). A partition not
        answered for is left out: the caller asks again later. (That includes an
        answer of -1001 and no error, librdkafka's for a partition whose leader is
        not known yet.)"""
        futures = self._admin.list_offsets(
            {TopicPartition(topic, partition): _LATEST for topic, partition in keys},
            isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=timeout_s)
        found: dict[tuple[str, int], int] = {}
        for tp, future in futures.items():
            try:
                offset = int(future.result(timeout_s).offset)
            except (KafkaException, TimeoutError):
                continue
            if offset >= 0:
                found[(tp.topic, tp.partition)] = offset
        return found

    def topic_config(self, topic: str) -> dict[str, str]:
        with self._lock:
            cached = self._topic_configs.get(topic)
        if cached is not None:
            return cached
        config = self._describe(ConfigResource(ConfigResource.Type.TOPIC, topic), topic)
        with self._lock:
            self._topic_configs[topic] = config
        return config

    def forget_topic_configs(self) -> None:
        with self._lock:
            self._topic_configs.clear()

    def broker_config(self) -> dict[str, str]:
        """One broker's configuration. Metadata without a broker in it (as while the
        only broker is paused: docs/journal/2026-11-23-chaos-campaigns.md) is the
        cluster's "not now"."""
        where = Where("describe_configs")
        try:
            metadata = self._admin.list_topics(timeout=_TIMEOUT_S)
        except KafkaException as exc:
            raise _translated(exc, where) from exc
        if not metadata.brokers:
            raise RetriableError(where, KafkaError(
                KafkaError._ALL_BROKERS_DOWN, "the cluster metadata names no broker",
                retriable=True))
        broker_id = str(next(iter(metadata.brokers)))
        return self._describe(ConfigResource(ConfigResource.Type.BROKER, broker_id), None)

    def _describe(self, resource: ConfigResource, topic: str | None) -> dict[str, str]:
        future = self._admin.describe_configs([resource])[resource]
        where = Where("describe_configs", topic=topic)
        try:
            entries = future.result(timeout=_TIMEOUT_S)
        except TimeoutError as exc:  # the cluster's failure, never the record's
            raise _no_answer(where) from exc
        except KafkaException as exc:
            if topic is not None and "UNKNOWN_TOPIC" in str(exc):
                raise UnknownTopicError(f"topic {topic!r} does not exist") from exc
            raise _translated(exc, where) from exc  # a broker restarting: "not now"
        return {name: entry.value for name, entry in entries.items()}


class _Known(dict[str, int]):
    """Limits looked up so far; a topic missing from it is asked for (``missing``)."""

    __slots__ = ("missing",)

    def __init__(self, missing: Callable[[str], int]) -> None:
        super().__init__()
        self.missing = missing

    def __missing__(self, topic: str) -> int:
        return self.missing(topic)


class OutputLimits:
    """``topic -> max bytes`` for an output: the smaller of the producer's
    ``message.max.bytes`` and the topic's ``max.message.bytes``. A topic that does
    not exist raises UnknownTopicError, which dead-letters the record instead of
    looping on a produce that can never succeed; that answer is kept for
    ``unknown_ttl_s`` so a record per unknown topic does not cost a lookup each.

    ``blocking=False`` (the stage): a topic not looked up yet raises
    TopicLimitPending at once; ``resolve`` does the lookup, beside the loop, with
    retries for the cluster's transient failures."""

    def __init__(self, cluster: Cluster, producer_max_bytes: int, *, blocking: bool = True,
                 unknown_ttl_s: float = 30.0, deadline_s: float = 60.0) -> None:
        self.cluster = cluster
        self._producer_max = producer_max_bytes
        self._blocking = blocking
        self._unknown_ttl_s = unknown_ttl_s
        self._deadline_s = deadline_s
        self._known = _Known(self._missing)
        self._unknown: dict[str, float] = {}  # topic -> monotonic time the answer expires
        # The hot path's ``max_bytes`` (one call per output): a dict's own lookup, in C;
        # only a topic not known yet reaches Python (``_missing``).
        self.lookup: Callable[[str], int] = self._known.__getitem__

    @property
    def producer_max_bytes(self) -> int:
        return self._producer_max

    def __call__(self, topic: str) -> int:
        return self._known[topic]

    def _missing(self, topic: str) -> int:
        expires = self._unknown.get(topic)
        if expires is not None and time.monotonic() < expires:
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        if not self._blocking:
            raise TopicLimitPending(topic)
        self.resolve(topic)
        return self(topic)

    def forget(self) -> None:
        """Ask again for every topic: one was deleted while the stage ran (a produce
        found it gone), and a known limit would keep routing records to it."""
        self._known.clear()
        self._unknown.clear()
        self.cluster.forget_topic_configs()

    def resolve(self, topic: str) -> None:
        """Look the topic's limit up (blocking); retriable failures are retried until
        the deadline, then raised."""
        deadline = time.monotonic() + self._deadline_s
        try:
            config = retry_until(deadline, lambda: self.cluster.topic_config(topic),
                                 pause=_RESOLVE_PAUSE_S)
        except UnknownTopicError:
            self._unknown[topic] = time.monotonic() + self._unknown_ttl_s
            return
        except DeniedError:  # no DESCRIBE_CONFIGS: the producer's own limit
            self._known[topic] = self._producer_max
            return
        topic_max = int(config.get("max.message.bytes", self._producer_max))
        self._known[topic] = min(topic_max, self._producer_max)
        self._unknown.pop(topic, None)
