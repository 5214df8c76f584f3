"""The least-privilege ACL set of a stage, as admin-API bindings and as ``kafka-acls.sh``
commands (docs/security.md; tests/integration/test_security.py grants exactly these).

READ and WRITE imply DESCRIBE in Kafka's authorizer, so DESCRIBE is never granted on
its own. The start-up checks that read configs (DESCRIBE_CONFIGS) are skipped with a
warning without it, so it is not in the set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from service.stage.overruns import overruns_topic


@dataclass(frozen=True, slots=True)
class Grant:
    """One ALLOW ACL: ``operation`` on a resource, for one principal from any host."""

    operation: str          # READ, WRITE
    resource: str           # topic, group, transactional-id
    name: str
    prefixed: bool = False

    def binding(self, principal: str) -> AclBinding:
        return AclBinding(
            _RESOURCE_TYPES[self.resource], self.name,
            ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL,
            principal, "*", AclOperation[self.operation], AclPermissionType.ALLOW)

    def command(self, principal: str) -> str:
        pattern = " --resource-pattern-type prefixed" if self.prefixed else ""
        return (f"kafka-acls.sh --bootstrap-server $BOOTSTRAP --command-config admin.properties"
                f" --add --allow-principal {principal} --operation {self.operation}"
                f" --{self.resource} '{self.name}'{pattern}")

    def __str__(self) -> str:
        kind = f"{self.resource} prefix" if self.prefixed else self.resource
        return f"{self.operation} on {kind} `{self.name}`"


_RESOURCE_TYPES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                   "transactional-id": ResourceType.TRANSACTIONAL_ID}


def stage_grants(*, input_topics: Sequence[str], group_id: str, output_topic: str,
                 dlq_topic: str = "", transactional_id_prefix: str = "",
                 exactly_once: bool = True, transform_timeout: bool = True) -> list[Grant]:
    """Everything a replica needs, nothing more. The transactional ids are
    ``<prefix>.<topic>.<partition>`` (``<prefix>.replica.<id>`` with spanning
    transactions), one PREFIXED ACL on ``<prefix>.`` covers them all;
    ``<prefix>`` is TXSTAGE_TRANSACTIONAL_ID_PREFIX, else the group id. With the
    transform time-out on (TXSTAGE_TRANSFORM_TIMEOUT_MS, in-process): READ, WRITE and
    CREATE on ``<prefix>.txstage.overruns``, which the first overrun creates and every
    positioning reads (service/stage/overruns.py)."""
    prefix = transactional_id_prefix or group_id
    grants = [Grant("READ", "topic", topic) for topic in input_topics]
    grants.append(Grant("READ", "group", group_id))
    grants += [Grant("WRITE", "topic", topic) for topic in (output_topic, dlq_topic) if topic]
    if exactly_once:
        grants.append(Grant("WRITE", "transactional-id", f"{prefix}.", prefixed=True))
    if transform_timeout:
        grants += [Grant(op, "topic", overruns_topic(prefix))
                   for op in ("READ", "WRITE", "CREATE")]
    return grants


def backfill_grants(*, input_topics: Sequence[str], output_topic: str, dlq_topic: str = "",
                    transactional_id_prefix: str, progress_topic: str) -> list[Grant]:
    """A Kafka-to-Kafka backfill: the stage's topic and transactional-id grants (its ids
    are ``<prefix>.backfill.<job>.<slice>``, under the same prefix), and READ, WRITE and
    CREATE on its progress topic, which the first run creates (later runs ask to
    create it again and accept TOPIC_ALREADY_EXISTS; not tested without CREATE).
    DESCRIBE on the groups ``<prefix>.backfill.`` (PREFIXED): the progress reader names a
    group ``<prefix>.backfill.<job>`` that it never joins, but librdkafka still looks up
    that group's coordinator (FindCoordinator needs DESCRIBE)."""
    grants = [Grant("READ", "topic", topic) for topic in input_topics]
    grants += [Grant("WRITE", "topic", topic) for topic in (output_topic, dlq_topic) if topic]
    grants.append(Grant("WRITE", "transactional-id", f"{transactional_id_prefix}.",
                        prefixed=True))
    grants += [Grant(op, "topic", progress_topic) for op in ("READ", "WRITE", "CREATE")]
    grants.append(Grant("DESCRIBE", "group", f"{transactional_id_prefix}.backfill.",
                        prefixed=True))
    return grants


def audit_grants(*, input_topics: Sequence[str], group_id: str,
                 output_topics: Sequence[str]) -> list[Grant]:
    """``txstage audit``, read-only: READ on every input, output and dead-letter topic and
    DESCRIBE on the stage's group (its committed offsets). Its readers name a group
    ``<group>.audit`` they never join: that needs no ACL (tested without one)."""
    grants = [Grant("READ", "topic", topic) for topic in (*input_topics, *output_topics)]
    grants.append(Grant("DESCRIBE", "group", group_id))
    return grants


def redrive_grants(*, dlq_topic: str, output_topics: Sequence[str],
                   transactional_id_prefix: str) -> list[Grant]:
    """``txstage redrive``: READ on the dead-letter topic, WRITE on the output topics and
    on the DLQ (letters that fail again), WRITE on its transactional id
    ``<prefix>.redrive.<dlq>`` (under the stage's PREFIXED grant ``<prefix>.``), and READ,
    WRITE and CREATE on its progress topic ``<prefix>.redrive.progress`` and on the
    parking topic ``<dlq>.parked`` (letters that failed ``--max-attempts`` times; READ to
    redrive them once fixed). (Its readers name a group ``<prefix>.redrive`` they never
    join: no ACL, as for the audit.)"""
    progress = f"{transactional_id_prefix}.redrive.progress"
    grants = [Grant("READ", "topic", dlq_topic)]
    grants += [Grant("WRITE", "topic", topic) for topic in dict.fromkeys([*output_topics,
                                                                          dlq_topic])]
    grants.append(Grant("WRITE", "transactional-id", f"{transactional_id_prefix}.",
                        prefixed=True))
    grants += [Grant(op, "topic", topic) for topic in (progress, f"{dlq_topic}.parked")
               for op in ("READ", "WRITE", "CREATE")]
    return grants
