"""A backfill of an Avro topic on real Spark, the real broker and the real registry:
the same decoding and encoding as the stream's, so its outputs are the stream's bytes
(``txstage backfill verify``: EQUAL).

Takes ≈ 15 s (2 cores, alone: Spark's start included).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer

from service.local_registry.process import Registry
from tests.harness import formats
from tests.harness.formats import EXAMPLES, ORDER, PRICED
from tests.harness.spark import (  # noqa: F401  (fixtures)
    Backfill,
    backfill_fixture,
    spark_fixture,
)
from tests.harness.stage import PARTITIONS, StageSetup, one_protocol

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.usefixtures("spark")]


@one_protocol("classic")
def test_a_backfill_of_an_avro_topic_equals_the_stream(
        stage: StageSetup, schema_registry: Registry, new_topic: Callable[..., str],
        backfill: Backfill, monkeypatch: pytest.MonkeyPatch) -> None:
    url = schema_registry.url
    registry = formats.client(url)
    registry.register_schema(f"{stage.input_topic}-value", Schema(ORDER, "AVRO"))
    registry.register_schema(f"{stage.output_topic}-value", Schema(PRICED, "AVRO"))
    orders = [{"id": i, "amount": i / 4, "currency": "EUR"} for i in range(1, 301)]
    formats.produce(stage.bootstrap, stage.input_topic, [*orders, b"not avro"],
                    AvroSerializer(registry, ORDER, conf={"auto.register.schemas": False}),
                    PARTITIONS)
    env = formats.stage_env(url, "avro",
                            TXSTAGE_OUTPUT_VALUE_SCHEMA=str(EXAMPLES / "priced_order.avsc"),
                            TXSTAGE_TRANSFORM="service.examples.avro_orders:price")
    stream = stage.replica("stream", **env)
    stream.wait_ready(60)
    stage.wait_committed()
    assert stream.terminate() == 0
    for name, value in {**env, "TXSTAGE_OUTPUT_TOPIC": stage.output_topic,
                        "TXSTAGE_DLQ_TOPIC": stage.dlq_topic}.items():
        monkeypatch.setenv(name, value)
    out, dlq = new_topic(partitions=4, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")
    code, printed, err = backfill("--source", f"kafka://{stage.input_topic}",
                                  "--sink", f"kafka://{out}", "--dlq-topic", dlq)
    assert code == 0, err
    code, printed, err = backfill(
        "verify", "--expected", f"kafka://{stage.output_topic},{stage.dlq_topic}",
        "--actual", f"kafka://{out},{dlq}", "--rename", f"{stage.output_topic}={out}",
        "--rename", f"{stage.dlq_topic}={dlq}")
    assert code == 0 and "EQUAL: " in printed and "301 expected outputs, 301 actual" in printed, \
        printed + err
