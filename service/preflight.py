"""Validation of settings against the live cluster (``txstage check-config``, and
``txstage run`` before it touches a record). Each problem is one line."""

from __future__ import annotations

import time

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
from service.kafka.cluster import DEFAULT_MESSAGE_MAX_BYTES, UNSAID, Cluster
from service.kafka.config import consumer_config, producer_config
from service.kafka.retry import retry_until
from service.settings import Settings

log = structlog.get_logger(__name__)
_RETRY_S = 1.0


def producer_max_bytes(settings: Settings) -> int:
    return int(str(producer_config(settings, None).get("message.max.bytes",
                                                       DEFAULT_MESSAGE_MAX_BYTES)))


def check_cluster(settings: Settings, cluster: Cluster, *, wait_s: float = 0.0) -> None:
    """Raise ConfigError listing every problem found; return when there is none.

    While the cluster answers "not now" (a broker restarting or paused, no broker in
    the metadata yet) the checks are asked again for up to ``wait_s``, each time
    through a new admin client: a replica that starts during a broker restart waits
    for it instead of exiting (docs/decisions.md, "A cluster that cannot answer at
    start-up is asked again")."""
    began = time.monotonic()
    deadline = began + wait_s

    def checks() -> list[str]:
        try:
            problems = [*_topic_problems(settings, cluster),
                        *_group_problems(settings, cluster),
                        *_transactional_problems(settings, cluster),
                        *_timeout_problems(settings, cluster)]
            return problems or _size_problems(settings, cluster)
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
        problems = retry_until(deadline, checks, pause=_RETRY_S, on_retry=waiting,
                               renew=cluster.renew)
    except DeniedError as exc:
        raise ConfigError(str(exc)) from exc
    except KafkaOperationError as exc:  # a RetriableError too, once the wait is over
        raise UnreachableError(
            f"cannot query the cluster at TXSTAGE_BOOTSTRAP_SERVERS="
            f"{settings.bootstrap_servers} (asked for {time.monotonic() - began:.0f} s): "
            f"{exc.where}: {exc.error.str()}; check the address and that the brokers are up"
        ) from exc
    if problems:
        raise ConfigError(*problems)


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


def _size_problems(settings: Settings, cluster: Cluster) -> list[str]:
    mine = producer_max_bytes(settings)
    problems = []
    for topic in filter(None, (settings.output_topic, settings.dlq_topic)):
        try:
            theirs = int(cluster.topic_config(topic).get("max.message.bytes", mine))
        except DeniedError as exc:
            _skipped(f"max.message.bytes of {topic}", exc)
            continue
        if mine > theirs:
            problems.append(
                f"the producer's message.max.bytes={mine} exceeds topic {topic!r} "
                f"max.message.bytes={theirs}: set TXSTAGE_PRODUCER__MESSAGE_MAX_BYTES={theirs} "
                f"or raise the topic's limit")
    return problems


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
