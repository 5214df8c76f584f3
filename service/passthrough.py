"""librdkafka properties passed through the settings (``TXSTAGE_KAFKA__<property>``,
``TXSTAGE_CONSUMER__`` and ``TXSTAGE_PRODUCER__``): the ones txstage refuses, and why."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import SecretStr

PASSTHROUGH_PREFIXES = {"kafka": "TXSTAGE_KAFKA__", "consumer": "TXSTAGE_CONSUMER__",
                        "producer": "TXSTAGE_PRODUCER__"}

# Properties txstage sets itself; overriding any would silently void the guarantee.
PROTECTED = {
    "isolation.level": "exactly-once reads only committed input (read_committed)",
    "enable.auto.commit": "offsets are committed only inside transactions",
    "enable.auto.offset.store": "offsets are committed only inside transactions",
    "transactional.id": "derived per input partition as <prefix>.<topic>.<partition>",
    "enable.idempotence": "transactions need the idempotent producer",
    "group.id": "set TXSTAGE_GROUP_ID instead",
    "bootstrap.servers": "set TXSTAGE_BOOTSTRAP_SERVERS instead",
    "partition.assignment.strategy": "the stage relies on cooperative-sticky rebalancing",
    "transaction.timeout.ms": "set TXSTAGE_TRANSACTION_TIMEOUT_MS instead",
    "group.protocol": "set TXSTAGE_GROUP_PROTOCOL=classic|consumer instead",
}

# Consumer properties of the classic protocol only; with the next-generation
# protocol (KIP-848) the broker owns them and librdkafka refuses them.
CLASSIC_ONLY = {
    "session.timeout.ms": "the session timeout is the broker's group.consumer.session.timeout.ms",
    "heartbeat.interval.ms": "the heartbeat interval is the broker's "
                             "group.consumer.heartbeat.interval.ms",
    "group.protocol.type": "it applies to the classic protocol only",
}

# auto.offset.reset: where a partition with no committed offset starts (librdkafka's
# names for each end). The stage seeks there itself (service.stage.loop), so
# "error" (fail the fetch) has nothing to act on and is refused.
OFFSET_RESETS = {"earliest": False, "smallest": False, "beginning": False,
                 "latest": True, "largest": True, "end": True}  # name -> at the end

Section = Mapping[str, SecretStr]


def passthrough_problems(kafka: Section, consumer: Section, producer: Section,
                         group_protocol: str) -> list[str]:
    """One line for each pass-through property that cannot be used: one txstage sets
    itself, one of the classic protocol only under ``consumer``, an offset reset that
    names no end."""
    sections = {"kafka": kafka, "consumer": consumer, "producer": producer}
    found = [f"{PASSTHROUGH_PREFIXES[section]}{prop} cannot be set: {PROTECTED[prop]}"
             for section, props in sections.items() for prop in props if prop in PROTECTED]
    readers = (("kafka", kafka), ("consumer", consumer))
    if group_protocol == "consumer":
        found += [f"{PASSTHROUGH_PREFIXES[section]}{prop} cannot be set with "
                  f"TXSTAGE_GROUP_PROTOCOL=consumer: {CLASSIC_ONLY[prop]}"
                  for section, props in readers for prop in props if prop in CLASSIC_ONLY]
    found += [f"{PASSTHROUGH_PREFIXES[section]}auto.offset.reset={value.get_secret_value()} "
              "cannot be used: a partition with no committed offset starts at "
              "earliest (smallest, beginning) or latest (largest, end)"
              for section, props in readers
              if (value := props.get("auto.offset.reset")) is not None
              and value.get_secret_value() not in OFFSET_RESETS]
    return found
