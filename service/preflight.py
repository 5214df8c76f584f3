"""Validation of settings against the live cluster (``txstage check-config``, and
``txstage run`` before it touches a record). Each problem is one line."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import structlog

from service.errors import (
    ConfigError,
    DeniedError,
    KafkaOperationError,
    RetriableError,
    UnreachableError,
    Where,
    transactional_prefix,
)
from service.kafka.cluster import DEFAULT_MESSAGE_MAX_BYTES, UNSAID, Cluster, UnknownTopicError
from service.kafka.config import consumer_config, producer_config
from service.kafka.retry import retry_until
from service.settings import Settings

log = structlog.get_logger(__name__)
_RETRY_S = 1.0


# librdkafka's range for message.max.bytes (its CONFIGURATION.md).
MESSAGE_MAX_BYTES_RANGE = (1_000, 1_000_000_000)


def producer_max_bytes(settings: Settings, topic_limits: Iterable[int] = ()) -> int:
    """The producers' ``message.max.bytes``: the user's (``TXSTAGE_PRODUCER__`` or
    ``TXSTAGE_KAFKA__MESSAGE_MAX_BYTES``) when set; otherwise the largest of
    ``topic_limits`` (the ``max.message.bytes`` of the topics they write), within
    librdkafka's range, so a record a topic takes is never refused by the producer
    first; librdkafka's own default when no limit is known. No headroom is added:
    librdkafka counts a message's key, value, headers and record framing against it
    (not the request's or the batch's), always sends a message that passes alone,
    and each output is checked first against min(this, its topic's limit) with
    FRAMING_BYTES to spare (service/contract/processing.py)."""
    told = told_max_bytes(settings)
    if told is not None:
        return told
    largest = max(topic_limits, default=None)
    if largest is None:
        return DEFAULT_MESSAGE_MAX_BYTES
    low, high = MESSAGE_MAX_BYTES_RANGE
    return min(max(largest, low), high)


def told_max_bytes(settings: Settings) -> int | None:
    """The producers' ``message.max.bytes`` the user set, if they did."""
    told = producer_config(settings, None).get("message.max.bytes")
    return None if told is None else int(str(told))


def _told_variable(settings: Settings) -> str | None:
    """The variable that set the producers' ``message.max.bytes``, if one did."""
    for section in ("producer", "kafka"):  # the producer's own wins (producer_config)
        if "message.max.bytes" in getattr(settings, section):
            return settings.passthrough_variable(section, "message.max.bytes")
    return None


def topic_max_bytes(cluster: Cluster, topics: Sequence[str]) -> dict[str, int]:
    """Each topic's ``max.message.bytes``; one that cannot be read (no DESCRIBE_CONFIGS,
    logged; or gone) is left out."""
    found: dict[str, int] = {}
    for topic in dict.fromkeys(topics):
        try:
            value = cluster.topic_config(topic).get("max.message.bytes")
        except DeniedError as exc:
            _skipped(f"max.message.bytes of {topic}", exc)
            continue
        except UnknownTopicError:
            continue
        if value is not None:
            found[topic] = int(value)
    return found


def sized_max_bytes(settings: Settings, cluster: Cluster) -> int:
    """producer_max_bytes from the output and dead-letter topics' limits, looked up
    (for a tool that writes where the stage does without running its checks)."""
    writes = [t for t in (settings.output_topic, settings.dlq_topic) if t]
    return producer_max_bytes(settings, topic_max_bytes(cluster, writes).values())


@dataclass(frozen=True, slots=True)
class Checked:
    """What the checks found that the stage runs with."""

    producer_max_bytes: int  # the producers' message.max.bytes (producer_max_bytes)
    warnings: tuple[str, ...] = ()  # one line each; the stage runs anyway


def check_cluster(settings: Settings, cluster: Cluster, *, wait_s: float = 0.0) -> Checked:
    """Raise ConfigError listing every problem found; when there is none, return what
    the stage runs with (the producers' size, warnings).

    While the cluster answers "not now" (a broker restarting or paused, no broker in
    the metadata yet) the checks are asked again for up to ``wait_s``, each time
    through a new admin client: a replica that starts during a broker restart waits
    for it instead of exiting (docs/decisions.md, "A cluster that cannot answer at
    start-up is asked again")."""
    began = time.monotonic()
    deadline = began + wait_s

    def checks() -> tuple[list[str], Checked | None]:
        try:
            problems = [*_topic_problems(settings, cluster),
                        *_group_problems(settings, cluster),
                        *_transactional_problems(settings, cluster),
                        *_timeout_problems(settings, cluster)]
            return (problems, None) if problems else _sizes(settings, cluster)
        except RetriableError as exc:
            denied = cluster.denial()
            if denied is not None:  # the cluster is there and said no: never wait for it
                raise ConfigError(str(denied)) from exc
            raise

    def waiting(exc: RetriableError) -> None:
        now = time.monotonic()
        log.warning("startup.cluster_unavailable", error=str(exc),
                    waited_s=round(now - began, 1), left_s=round(max(deadline - now, 0), 1))

    try:
        # renew: a client that waited through the outage may not recover
        problems, checked = retry_until(deadline, checks, pause=_RETRY_S, on_retry=waiting,
                                        renew=cluster.renew)
    except DeniedError as exc:
        raise ConfigError(str(exc)) from exc
    except KafkaOperationError as exc:  # a RetriableError too, once the wait is over
        raise UnreachableError(
            f"cannot query the cluster at TXSTAGE_BOOTSTRAP_SERVERS="
            f"{settings.bootstrap_servers} (asked for {time.monotonic() - began:.0f} s): "
            f"{exc.where}: {exc.error.str()}; check the address and that the brokers are up"
        ) from exc
    if problems or checked is None:
        raise ConfigError(*problems)
    return checked


def _missing(permission: str) -> str:
    return f"missing permission: {permission}"


def _topic_problems(settings: Settings, cluster: Cluster) -> list[str]:
    """Each topic exists and this principal may READ (inputs) or WRITE (outputs) it."""
    wanted = [("TXSTAGE_INPUT_TOPICS", t, "READ") for t in settings.input_topics]
    wanted.append(("TXSTAGE_OUTPUT_TOPIC", settings.output_topic, "WRITE"))
    if settings.dlq_topic:
        wanted.append(("TXSTAGE_DLQ_TOPIC", settings.dlq_topic, "WRITE"))
    found = cluster.topic_operations([topic for _, topic, _ in wanted])
    problems = []
    for name, topic, needed in wanted:
        operations = found.get(topic)
        if operations is None:
            problems.append(f"{name}: topic {topic!r} does not exist")
        elif needed not in operations and operations != UNSAID:
            problems.append(_missing(f"{needed} on topic `{topic}` ({name})"))
    return problems


def _group_problems(settings: Settings, cluster: Cluster) -> list[str]:
    operations = cluster.group_operations(settings.group_id)
    if "READ" in operations or operations == UNSAID:
        return []
    return [_missing(f"READ on group `{settings.group_id}` (TXSTAGE_GROUP_ID)")]


def _transactional_problems(settings: Settings, cluster: Cluster) -> list[str]:
    """One init_transactions of ``<prefix>.txstage-check``: the ACL that lets the stage
    use ``<prefix>.<topic>.<partition>`` (a PREFIXED one on ``<prefix>.``) allows it."""
    if not settings.exactly_once:
        return []
    probe = f"{settings.id_prefix}.txstage-check"
    if cluster.transactions_allowed(producer_config(settings, probe)):
        return []
    prefix = transactional_prefix(Where("init_transactions", probe))
    return [_missing(f"WRITE on transactional id prefix `{prefix}` "
                     f"(PREFIXED; the ids are {prefix}<topic>.<partition>)")]


def _timeout_problems(settings: Settings, cluster: Cluster) -> list[str]:
    if not settings.exactly_once:
        return []
    try:
        ceiling = int(cluster.broker_config().get("transaction.max.timeout.ms", "900000"))
    except DeniedError as exc:
        _skipped("transaction.max.timeout.ms", exc)
        return []
    if settings.transaction_timeout_ms > ceiling:
        return [f"TXSTAGE_TRANSACTION_TIMEOUT_MS={settings.transaction_timeout_ms} is above "
                f"the broker's transaction.max.timeout.ms={ceiling}"]
    return []


def _sizes(settings: Settings, cluster: Cluster) -> tuple[list[str], Checked]:
    """The producers' size from the topics they write; a size the user set that a topic
    cannot take is a problem; an input topic that takes records larger than the
    dead-letter topic holds, a warning."""
    writes = [t for t in (settings.output_topic, settings.dlq_topic) if t]
    limits = topic_max_bytes(cluster, writes)
    mine = producer_max_bytes(settings, limits.values())
    told = _told_variable(settings)
    problems = [
        f"the producer's message.max.bytes={mine} exceeds topic {topic!r} "
        f"max.message.bytes={theirs}: set {told}={theirs} or raise the topic's limit"
        for topic, theirs in limits.items() if told is not None and mine > theirs]
    return problems, Checked(mine, tuple(_dead_letter_warnings(settings, cluster, limits,
                                                               mine, told)))


def _dead_letter_warnings(settings: Settings, cluster: Cluster, limits: dict[str, int],
                          mine: int, told: str | None) -> list[str]:
    """A record larger than the dead-letter topic holds (the smaller of its
    max.message.bytes and the producers' message.max.bytes) is dead-lettered without
    its value, which redrive cannot process."""
    dlq = settings.dlq_topic
    if not dlq or dlq not in limits:
        return []
    holds = min(limits[dlq], mine)
    warnings = []
    for topic, accepts in topic_max_bytes(cluster, settings.input_topics).items():
        if accepts <= holds:
            continue
        fixes = []
        if limits[dlq] < accepts:
            fixes.append(f"raise topic {dlq!r} max.message.bytes to {accepts}")
        if told is not None and mine < accepts:
            fixes.append(f"set {told}={accepts}")
        warnings.append(
            f"input topic {topic!r} max.message.bytes={accepts} is larger than the "
            f"dead-letter topic {dlq!r} holds ({holds} bytes: its max.message.bytes="
            f"{limits[dlq]}, the producer's message.max.bytes={mine}): a larger record is "
            f"dead-lettered without its value and cannot be redriven; {' and '.join(fixes)}")
    return warnings


def _skipped(check: str, exc: DeniedError) -> None:
    """A check that needs DESCRIBE_CONFIGS, which the least-privilege ACL set leaves out."""
    log.warning("startup.check_skipped", check=check, reason=str(exc),
                hint="grant DESCRIBE_CONFIGS to have it checked")


def session_timeout_s(settings: Settings, cluster: Cluster) -> float:
    """How long the group takes to notice a member is gone. A fenced partition is
    reclaimed only after this long, so a zombie never fences the real owner.

    Classic protocol: the consumer's own ``session.timeout.ms``. Next-generation
    protocol: the broker's ``group.consumer.session.timeout.ms``."""
    if settings.group_protocol == "classic":
        return float(str(consumer_config(settings).get("session.timeout.ms", 45_000))) / 1000
    try:
        value = cluster.broker_config().get("group.consumer.session.timeout.ms", "45000")
    except KafkaOperationError:
        value = "45000"
    return float(value) / 1000
