"""The documented least-privilege ACL set (docs/security.md), built from a stage's names."""

from __future__ import annotations

from confluent_kafka.admin._acl import AclOperation
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from service.tools.acls import backfill_grants, stage_grants


def test_the_stage_needs_read_on_inputs_and_group_write_on_outputs_and_its_id_prefix() -> None:
    grants = stage_grants(input_topics=["a", "b"], group_id="g", output_topic="out",
                          dlq_topic="dlq", transactional_id_prefix="orders")
    assert [str(g) for g in grants] == [
        "READ on topic `a`", "READ on topic `b`", "READ on group `g`", "WRITE on topic `out`",
        "WRITE on topic `dlq`", "WRITE on transactional-id prefix `orders.`",
        "READ on topic `orders.txstage.overruns`", "WRITE on topic `orders.txstage.overruns`",
        "CREATE on topic `orders.txstage.overruns`"]


def test_at_least_once_without_a_dlq_needs_no_transactional_id_and_no_dlq() -> None:
    grants = stage_grants(input_topics=["a"], group_id="g", output_topic="out",
                          exactly_once=False, transform_timeout=False)
    assert [str(g) for g in grants] == ["READ on topic `a`", "READ on group `g`",
                                        "WRITE on topic `out`"]


def test_the_transactional_id_grant_is_one_prefixed_binding_and_one_command() -> None:
    grant = stage_grants(input_topics=["a"], group_id="g", output_topic="out",
                         transform_timeout=False)[-1]
    binding = grant.binding("User:stage")
    assert (binding.restype, binding.name, binding.resource_pattern_type, binding.operation) == (
        ResourceType.TRANSACTIONAL_ID, "g.", ResourcePatternType.PREFIXED, AclOperation.WRITE)
    assert grant.command("User:stage").endswith(
        "--allow-principal User:stage --operation WRITE --transactional-id 'g.'"
        " --resource-pattern-type prefixed")


def test_the_backfill_shares_the_prefix_and_owns_its_progress_topic_and_reader_groups() -> None:
    grants = backfill_grants(input_topics=["a"], output_topic="out", dlq_topic="dlq",
                             transactional_id_prefix="bf", progress_topic="bf.backfill.progress")
    assert [str(g) for g in grants] == [
        "READ on topic `a`", "WRITE on topic `out`", "WRITE on topic `dlq`",
        "WRITE on transactional-id prefix `bf.`", "READ on topic `bf.backfill.progress`",
        "WRITE on topic `bf.backfill.progress`", "CREATE on topic `bf.backfill.progress`",
        "DESCRIBE on group prefix `bf.backfill.`"]
