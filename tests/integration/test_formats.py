"""Formats through a real schema registry (Apicurio, the session's ``schema_registry``)
and the real broker: inputs written by confluent-kafka's own serializers, outputs read
back by its own deserializers, V1-V5 over everything with the transform as the stage
wraps it.

Takes ≈ 32 s (2 cores, shared broker; one replica a test, the registry killed once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

from service.formats import wire
from service.local_registry.process import Registry
from tests.harness import formats
from tests.harness.formats import ORDER, ORDER_JSON_SCHEMA, ORDER_V2, PRICED, Order
from tests.harness.operator_tools import tool, violations
from tests.harness.reading import read_committed
from tests.harness.stage import PARTITIONS, StageSetup, one_protocol, paced, wait_for
from tests.harness.stage import value as metric_value

pytestmark = pytest.mark.kafka
# Looked up, not registered: each serializer writes with its own schema's id.
_FRESH = {"auto.register.schemas": False}
PRICED_FILE = "service/examples/priced_order.avsc"  # replicas run from the repository root


def _orders(n: int, start: int = 1) -> list[dict[str, Any]]:
    return [{"id": i, "amount": i / 4, "currency": "EUR"} for i in range(start, start + n)]


def _register(url: str, subject: str, text: str, kind: str = "AVRO") -> int:
    return int(formats.client(url).register_schema(subject, Schema(text, kind)))


def _dead_letters(stage: StageSetup) -> list[Any]:
    return read_committed(stage.bootstrap, stage.dlq_topic)


def _assert_exactly_once(stage: StageSetup, env: dict[str, str]) -> None:
    report = stage.verify(formats.formatted({**stage.env, **env}))
    assert report.ok, "\n".join(report.problems()) + "\n" + stage.logs()
    assert report.found == report.expected > 0


@one_protocol("classic")
def test_avro_in_avro_out_exactly_once(stage: StageSetup, schema_registry: Registry) -> None:
    """With bad input among it: bytes not in the wire format, an unknown schema id, and
    orders whose output breaks its schema: each dead-lettered with its cause."""
    url = schema_registry.url
    _register(url, f"{stage.input_topic}-value", ORDER)
    _register(url, f"{stage.output_topic}-value", PRICED)
    registry = formats.client(url)
    orders = _orders(1000)
    bad = [b"not avro at all", wire.header(987654) + b"\x02"]
    formats.produce(stage.bootstrap, stage.input_topic, [*orders, *bad],
                    AvroSerializer(registry, ORDER, conf=_FRESH), PARTITIONS)
    env = formats.stage_env(url, "avro", TXSTAGE_OUTPUT_VALUE_SCHEMA=PRICED_FILE,
                            TXSTAGE_TRANSFORM="tests.harness.formats:price_or_violate")
    stage.replica("a", **env).wait_ready(60)
    stage.wait_committed()
    priced = formats.read_values(stage.bootstrap, stage.output_topic,
                                 AvroDeserializer(registry))
    assert sorted(p["id"] for p in priced) == [o["id"] for o in orders if o["id"] % 100]
    assert all(p["amount_cents"] == p["id"] * 25 for p in priced)
    causes = sorted(dict(letter.headers)["txstage.error.message"].decode().split(":")[0]
                    for letter in _dead_letters(stage))
    violation = f"the output for {stage.output_topic!r} does not match its avro schema " \
                f"({stage.output_topic}-value)"
    assert causes == sorted([*[violation] * 10, "unknown schema id 987654",
                             "not in the schema registry wire format (magic byte 0 and a "
                             "4-byte schema id)"]), causes
    _assert_exactly_once(stage, env)
    code, audited, err = tool(stage, "audit", "--timeout", "90", env=env)
    assert code == 0 and violations(audited) == {}, (audited, err)
    # Redriven with the fixed transform: the letters' original bytes decoded once more.
    code, report, err = tool(stage, "redrive", env={
        **env, "TXSTAGE_TRANSFORM": "service.examples.avro_orders:price"})
    assert code == 0, err
    assert (report["redriven"], report["failed_again"]) == (10, 2), report
    redriven = [p for p in formats.read_values(stage.bootstrap, stage.output_topic,
                                               AvroDeserializer(registry)) if p["id"] % 100 == 0]
    assert sorted(p["id"] for p in redriven) == list(range(100, 1001, 100))


@one_protocol("classic")
def test_json_schema_in_and_out(stage: StageSetup, schema_registry: Registry) -> None:
    url = schema_registry.url
    for topic in (stage.input_topic, stage.output_topic):
        _register(url, f"{topic}-value", ORDER_JSON_SCHEMA, "JSON")
    registry = formats.client(url)
    orders = [{"id": o["id"], "amount": o["amount"]} for o in _orders(200)]
    formats.produce(stage.bootstrap, stage.input_topic, orders,
                    JSONSerializer(ORDER_JSON_SCHEMA, registry, conf=_FRESH), PARTITIONS)
    env = formats.stage_env(url, "json_schema",
                            TXSTAGE_TRANSFORM="tests.harness.formats:identity")
    stage.replica("a", **env).wait_ready(60)
    stage.wait_committed()
    out = formats.read_values(stage.bootstrap, stage.output_topic,
                              JSONDeserializer(ORDER_JSON_SCHEMA))
    assert sorted(out, key=lambda o: o["id"]) == orders
    assert not _dead_letters(stage)
    _assert_exactly_once(stage, env)


@one_protocol("classic")
def test_protobuf_in_and_out(stage: StageSetup, schema_registry: Registry) -> None:
    url = schema_registry.url
    registry = formats.client(url)
    orders = [Order(**o) for o in _orders(200)]
    serializer = ProtobufSerializer(Order, registry, {"use.deprecated.format": False,
                                                      "auto.register.schemas": True})
    formats.produce(stage.bootstrap, stage.input_topic, orders, serializer, PARTITIONS)
    env = formats.stage_env(url, "protobuf", TXSTAGE_TRANSFORM="tests.harness.formats:identity",
                            TXSTAGE_INPUT_VALUE_SCHEMA="tests.harness.formats:Order",
                            TXSTAGE_OUTPUT_VALUE_SCHEMA="tests.harness.formats:Order",
                            TXSTAGE_REGISTRY_AUTO_REGISTER="true")
    stage.replica("a", **env).wait_ready(60)
    stage.wait_committed()
    out = formats.read_values(stage.bootstrap, stage.output_topic, ProtobufDeserializer(
        Order, {"use.deprecated.format": False}))
    assert sorted(o.id for o in out) == [o.id for o in orders]
    assert {o.currency for o in out} == {"EUR"}
    assert not _dead_letters(stage)
    _assert_exactly_once(stage, env)


@one_protocol("classic")
def test_the_registry_killed_mid_run_holds_records_and_loses_none(
        stage: StageSetup, schema_registry: Registry) -> None:
    """Version 2 of the input schema is first met while the registry is down: its
    partitions wait (lag grows, nothing dead-lettered, not ready, the gauge 0), and
    go on by themselves once it is back; every record exactly once."""
    url = schema_registry.url
    # Framed here with each version's id: no serializer's lookup in a two-version subject
    # (Apicurio once left one unanswered for minutes).
    v1 = _register(url, f"{stage.input_topic}-value", ORDER)
    v2 = _register(url, f"{stage.input_topic}-value", ORDER_V2)
    _register(url, f"{stage.output_topic}-value", PRICED)
    raw = lambda value, ctx: value  # noqa: E731
    formats.produce(stage.bootstrap, stage.input_topic, formats.framed(v1, ORDER, _orders(400)),
                    raw, PARTITIONS)
    env = formats.stage_env(url, "avro", TXSTAGE_OUTPUT_VALUE_SCHEMA=PRICED_FILE,
                            TXSTAGE_TRANSFORM="service.examples.avro_orders:price")
    replica = stage.replica("a", **env)
    stage.wait_committed()
    later = formats.framed(v2, ORDER_V2, [{**o, "note": "v2"} for o in _orders(400, 401)])
    schema_registry.kill()
    try:
        formats.produce(stage.bootstrap, stage.input_topic, paced(later, per_second=400), raw,
                        PARTITIONS)
        wait_for(lambda: metric_value(replica, "txstage_schema_registry_up") == 0, 30,
                 "the gauge to say the registry is down", stage.logs)
        assert not replica.ready()
        time.sleep(3)
        assert not stage.committed(), "nothing past the unknown schema can commit"
        assert not _dead_letters(stage)
    finally:
        schema_registry.start()
    stage.wait_committed()
    wait_for(replica.ready, 30, "the replica to be ready again", stage.logs)
    assert metric_value(replica, "txstage_schema_registry_up") == 1
    assert not _dead_letters(stage)
    _assert_exactly_once(stage, env)
    assert replica.terminate() == 0


def test_check_config_names_an_incompatible_output_subject(
        schema_registry: Registry, unique_name: Any, kafka: Any, tmp_path: Any) -> None:
    url = schema_registry.url
    output = unique_name("priced")
    subject = f"{output}-value"
    registry = formats.client(url)
    _register(url, subject, PRICED)
    registry.set_compatibility(subject, "BACKWARD")
    incompatible = tmp_path / "incompatible.avsc"
    incompatible.write_text(json.dumps({"type": "record", "name": "PricedOrder", "fields": [
        {"name": "id", "type": "string"}, {"name": "total", "type": "long"}]}))
    env = {"TXSTAGE_BOOTSTRAP_SERVERS": kafka.bootstrap, "TXSTAGE_GROUP_ID": "g",
           "TXSTAGE_INPUT_TOPICS": unique_name("orders"), "TXSTAGE_OUTPUT_TOPIC": output,
           "TXSTAGE_TRANSFORM": "service.examples.avro_orders:price",
           **formats.stage_env(url, "avro", TXSTAGE_OUTPUT_VALUE_SCHEMA=str(incompatible))}
    result = subprocess.run([sys.executable, "-m", "service", "check-config"],
                            capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, **env})
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"subject '{subject}': the schema file is not compatible" in result.stderr
