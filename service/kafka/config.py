"""Settings → librdkafka configuration dicts: the only place client configs are built.

The exactly-once properties are applied last, after any pass-through, so nothing
can override them (settings.py also rejects attempts with a clear error).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from pydantic import SecretStr

from service.kafka.errors import kafka_error
from service.passthrough import PASSTHROUGH_PREFIXES
from service.settings import FILE_SUFFIX, Settings

Config = dict[str, Any]

# Once a consumer's prefetched records reach queued.max.messages.kbytes (64 MB: 64k
# records of 1 KB) or a partition's reach queued.min.messages (100k), librdkafka stops
# fetching that partition for fetch.queue.backoff.ms. Its default, 1 s, is longer than
# a reader takes to work through that much, so with it every reader stands idle part of
# each second: the stage's input consumer (and the bare loop) caps near 70k records/s
# of 1 KB whatever the stage costs (docs/journal/2026-11-26-fetch-backoff-and-runs.md),
# and so do the operator tools' and the verifier's read_committed readers.
FETCH_QUEUE_BACKOFF_MS = 20


def _plain(props: Mapping[str, SecretStr]) -> dict[str, str]:
    return {name: value.get_secret_value() for name, value in props.items()}


def client_id(settings: Settings, role: str) -> str:
    return f"txstage-{settings.group_id}-{role}-{socket.gethostname()}-{os.getpid()}"


def consumer_config(settings: Settings) -> Config:
    """The input consumer: a group member that only ever sees committed input.

    Classic protocol: cooperative-sticky (incremental: only moved partitions lose
    their producers) and a client-side session. Next-generation protocol
    (KIP-848): the broker assigns incrementally and owns the session and
    heartbeat settings, which librdkafka then refuses."""
    classic = settings.group_protocol == "classic"
    config: Config = {
        "auto.offset.reset": "earliest",
        # The end of each partition, reported once per reaching it: the lag gauge's
        # end past commit markers (Loop.consume_error).
        "enable.partition.eof": True,
        **(_classic_session(settings) if classic else {}),
        "max.poll.interval.ms": 300_000,
        "fetch.wait.max.ms": 100,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        "client.id": client_id(settings, "consumer"),
        **_plain(settings.kafka),
        **_plain(settings.consumer),
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": settings.group_id,
        "group.protocol": settings.group_protocol,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
    }
    if classic:
        config["partition.assignment.strategy"] = "cooperative-sticky"
    return config


def _classic_session(settings: Settings) -> Config:
    """The session timeout (45 s unless set) and a heartbeat of a tenth of it, at most
    librdkafka's 3 s. A dead member is noticed a session time-out after its last
    heartbeat, and the survivors learn of the rebalance at their next heartbeat: a
    3 s heartbeat under a 10 s session adds up to 3 s to every fail-over
    (docs/journal/2026-11-26-startup-pool-heartbeat.md)."""
    set_ms = settings.consumer.get("session.timeout.ms") or settings.kafka.get("session.timeout.ms")
    text = set_ms.get_secret_value().strip() if set_ms is not None else "45000"
    if not text.isdigit():
        return {}  # librdkafka refuses it, naming the property
    session_ms = int(text)
    return {"session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(100, min(3_000, session_ms // 10))}


# A transactional producer never re-bootstraps (librdkafka's default does, once every
# broker it knows is down, e.g. while the only broker restarts). Re-bootstrapping
# decommissions the brokers it knew, and the group coordinator it cached may be one
# of them: a send_offsets_to_transaction begun then waits for that dead broker to
# come up and never returns, whatever its timeout (librdkafka #5511 and #5456, open
# in 2.16): commits stay stuck until the stuck-call watchdog replaces the producer
# (docs/decisions.md, "Transactional producers do not re-bootstrap"). Restarted or
# replaced brokers keep their addresses (or DNS names), which the producer reconnects
# to. An operator can still set it back.
#
# A pinned producer sends one partition's outputs, a small share of the replica's: with
# librdkafka's 5 ms linger each of them sends a request every few milliseconds, and the
# broker's work per record is about 1.5 times at-least-once's (one shared producer,
# requests for every partition at once). Its outputs are read only once committed,
# and commit_transaction flushes at once whatever the linger, so lingering 50 ms
# delays nothing a read_committed reader sees, and it takes 5-25 % less broker and
# process CPU per record at 4, 8 and 64 partitions, at a throughput level or higher and
# the same end-to-end p99 (docs/journal/2026-11-26-pinned-producers-linger-50ms.md).
#
# connections.max.idle.ms: a broker that dies is dropped from the producer's metadata
# (decommissioned); if it was the cached group coordinator, a send_offsets_to_transaction
# waits for some broker connection to change state before it looks for the new one, and
# a producer stuck in a commit sends nothing (librdkafka #5511, fix not released). A
# connection idle for 30 s (up to 2 s less, librdkafka's jitter) is closed, which is that
# change: the commit goes on within 30 s of the death instead of waiting for the
# stuck-call watchdog (transaction time-out + 40 s). 30 s is the Java client's
# request.timeout.ms, so no response a slow broker may still give is cut short; the
# price is an idle producer reconnecting every 30 s, silently (docs/decisions.md).
_TRANSACTIONAL_DEFAULTS: Config = {"metadata.recovery.strategy": "none", "linger.ms": 50,
                                   "connections.max.idle.ms": 30_000}


def producer_config(settings: Settings, transactional_id: str | None, *,
                    message_max_bytes: int | None = None) -> Config:
    """A producer: pinned and transactional when ``transactional_id`` is given,
    otherwise the shared idempotent producer of at-least-once mode.
    ``message_max_bytes``: its size, sized from the topics it writes
    (preflight.producer_max_bytes); a value the user set wins."""
    config: Config = {
        "acks": "all",
        # At-least-once's shared producer: 20 ms rather than librdkafka's 5 fills
        # batches four times fuller at the same rate, so the broker does 30-40 % less
        # work per record; outputs are visible up to 15 ms later
        # (docs/journal/2026-11-27-at-least-once-linger-20ms.md). Pinned producers: 50
        # (_TRANSACTIONAL_DEFAULTS).
        "linger.ms": 20,
        # murmur2 like the Java client, so keys land where Kafka Streams and
        # Java producers would put them.
        "partitioner": "murmur2_random",
        # Back-to-back transactions meet CONCURRENT_TRANSACTIONS while the
        # previous one's markers are written; the 100 ms default backoff would
        # cap a partition at a few commits a second.
        "retry.backoff.ms": 10,
        "client.id": client_id(settings, "producer"),
        **(_TRANSACTIONAL_DEFAULTS if transactional_id is not None else {}),
        **({"message.max.bytes": message_max_bytes} if message_max_bytes is not None else {}),
        **_plain(settings.kafka),
        **_plain(settings.producer),
        "bootstrap.servers": settings.bootstrap_servers,
        "enable.idempotence": True,
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
        config["transaction.timeout.ms"] = settings.transaction_timeout_ms
    return config


def admin_config(settings: Settings) -> Config:
    return {
        **_plain(settings.kafka),
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": client_id(settings, "admin"),
    }


def refused_configs(settings: Settings) -> list[str]:
    """What librdkafka refuses in the clients these settings make. Settings pass their
    own checks and can still combine into a configuration librdkafka will not take (say
    ``message.timeout.ms`` above ``transaction.timeout.ms``): found here, at start-up,
    they exit 2 instead of failing with a traceback when the first producer is made.
    Each problem names the variable the user set (``TXSTAGE_PRODUCER__LINGER_MS=banana``,
    not librdkafka's canonical ``queue.buffering.max.ms``), found by building a refused
    client again without, or with only, each pass-through property (_culprits). The
    probe clients are created and closed at once (no request is waited for)."""
    sample = settings.transactional_id(settings.input_topics[0], 0) \
        if settings.exactly_once else None

    def producer(probe: Settings) -> str | None:
        return _refusal(Producer, producer_config(probe, sample))

    def consumer(probe: Settings) -> str | None:
        return _refusal(Consumer, consumer_config(probe))

    clients: tuple[tuple[str, Callable[[Settings], str | None], tuple[str, str]], ...] = (
        ("pinned producer" if sample is not None else "producer", producer,
         ("kafka", "producer")),
        ("consumer", consumer, ("kafka", "consumer")),
    )
    found: dict[tuple[str, str], list[str]] = {}  # (variables, reason) -> client roles
    for role, refusal, sections in clients:
        reason = refusal(settings)
        if reason is not None:
            for named in _culprits(settings, refusal, sections, reason):
                found.setdefault(named, []).append(role)
    return [f"{variables}librdkafka refuses the {' and '.join(roles)} configuration"
            f"{'s' if len(roles) > 1 else ''}: {reason}"
            for (variables, reason), roles in found.items()]


def _culprits(settings: Settings, refusal: Callable[[Settings], str | None],
              sections: tuple[str, str], reason: str) -> list[tuple[str, str]]:
    """(``"VARIABLE=value: "``, librdkafka's reason) for what librdkafka refuses: the
    pass-through properties without which the client's configuration is taken (several:
    refused together, e.g. a SASL protocol and an option it cannot use); when there
    is no such property (two bad ones, say), each property librdkafka refuses alone."""
    # The client's own section wins over the kafka one for a property set in both.
    effective = {prop: (section, value) for section in sections
                 for prop, value in getattr(settings, section).items()}
    empty: dict[str, dict[str, SecretStr]] = {section: {} for section in PASSTHROUGH_PREFIXES}

    def probe(props: Mapping[str, tuple[str, SecretStr]]) -> str | None:
        update = {section: {p: v for p, (s, v) in props.items() if s == section}
                  for section in PASSTHROUGH_PREFIXES}
        return refusal(settings.model_copy(update=update))

    def shown(props: Mapping[str, tuple[str, SecretStr]]) -> str:
        return ", ".join(_shown(settings, section, prop, value)
                         for prop, (section, value) in props.items())

    if not effective or refusal(settings.model_copy(update=empty)) is not None:
        prefixes = ", ".join(f"{PASSTHROUGH_PREFIXES[s]}*" for s in sections)
        return [("", f"{reason} ({prefixes})")]
    needed = {prop: origin for prop, origin in effective.items()
              if probe({p: o for p, o in effective.items() if p != prop}) is None}
    if len(needed) == 1:
        [prop] = needed
        return [(shown(needed) + ": ", _alias(reason, prop))]
    if needed:
        return [(shown(needed) + " (together): ", reason)]
    alone = [(shown({prop: origin}) + ": ", _alias(why, prop))
             for prop, origin in effective.items()
             if (why := probe({prop: origin})) is not None]
    return alone or [(shown(effective) + " (together): ", reason)]


def _alias(reason: str, prop: str) -> str:
    """librdkafka names a property by its canonical name: say which one the user set
    (``"queue.buffering.max.ms"`` is librdkafka's name for ``linger.ms``)."""
    named = _NAMED_PROPERTY.search(reason)
    if named is None or named[1] == prop or f'"{prop}"' in reason:
        return reason
    return f"{reason} (librdkafka's name for {prop})"


_NAMED_PROPERTY = re.compile(r'^Invalid value for configuration property "([^"]+)"')

# Pass-through values are secrets: one is shown only when its property is not named like
# a secret and it was not read from a file (TXSTAGE_KAFKA_FILE__...).
_SECRET_LIKE = re.compile(r"password|secret|key|pem|jaas|token|credential|config|keytab|"
                          r"extension|sasl\.username", re.IGNORECASE)


def _shown(settings: Settings, section: str, prop: str, value: SecretStr) -> str:
    variable = settings.passthrough_variable(section, prop)
    if FILE_SUFFIX in variable.upper() or _SECRET_LIKE.search(prop):
        return variable
    return f"{variable}={value.get_secret_value()}"


def _refusal(client: Callable[[Config], object], config: Config) -> str | None:
    """librdkafka's reason for refusing ``config``, or None when it takes it."""
    quiet: Config = {"log_level": 0, "error_cb": lambda error: None}
    try:
        made = client({**config, **quiet})
    except KafkaException as exc:
        return _reason(exc)
    except (TypeError, ValueError) as exc:  # confluent-kafka's own checks, in Python
        return str(exc)
    if isinstance(made, Producer):
        made.flush(0)
    elif isinstance(made, Consumer):
        made.close()
    return None


def _reason(exc: KafkaException) -> str:
    error = kafka_error(exc)
    return error.str() if error is not None else str(exc)
